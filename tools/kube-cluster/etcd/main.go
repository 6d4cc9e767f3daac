// Command etcd is the upstream etcd server, built from its Go module as the API server's
// store in gpupool's test bed (see tools/kube-cluster/README.md).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
