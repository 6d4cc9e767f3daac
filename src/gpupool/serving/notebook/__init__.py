"""Jupyter kernels on a share of the pool that give the GPU back while idle (`pip install 'gpupool[notebook]'`).

`kernelspec` writes and lists the kernelspecs (`gpupool kernel install`); `provisioner` is the
thin `jupyter_client` face; `proxy` relays the kernel's ZeroMQ channels and reads its status;
`gate` suspends the lease after idle time and resumes it before the next request.
"""

PROVISIONER_NAME = "gpupool-provisioner"
