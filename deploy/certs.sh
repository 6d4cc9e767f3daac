#!/bin/sh
# Webhook TLS and the agent token, into deploy/tls/ (a kustomize component the deploy uses).
#   deploy/certs.sh            create them if missing (what `make deploy` runs first)
#   deploy/certs.sh --rotate   renew the serving certificate with the same CA, then:
#                              kubectl apply -k deploy/   (the webhook re-reads it; caBundle unchanged)
# cert-manager instead: create a Certificate for gpupool-webhook.gpupool-system.svc into the Secret
# gpupool-webhook-tls, annotate both webhook configurations with
# cert-manager.io/inject-ca-from: gpupool-system/gpupool-webhook, and drop the caBundle patches.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out="$here/tls"
py=${PYTHON:-python3}
[ -x "$here/../.venv/bin/python" ] && py="$here/../.venv/bin/python"
# The agents' CA (agent-ca.crt/.key) is written once, kept across rotations; each node agent
# issues itself a serving certificate from it at start (restart the agents to renew theirs).
if [ "${1:-}" = "--rotate" ] || { [ -f "$out/tls.crt" ] && [ ! -f "$out/agent-ca.crt" ]; }; then
  "$py" -m gpupool kube certs --out "$out" --ca-cert "$out/ca.crt" --ca-key "$out/ca.key"
elif [ ! -f "$out/tls.crt" ]; then
  "$py" -m gpupool kube certs --out "$out"
fi
if [ ! -f "$out/agent-token" ]; then
  umask 077
  "$py" -c 'import secrets; print(secrets.token_urlsafe(32))' > "$out/agent-token"
fi
