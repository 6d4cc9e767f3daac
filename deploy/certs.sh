#!/bin/sh
# Webhook TLS and the agent token, into deploy/tls/ (a kustomize component), and `- tls` added to
# the components of deploy/kustomization.yaml (once): a fresh checkout's deploy/ renders without it.
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
# kustomize has no optional component: the base names none (it renders on a fresh checkout, and
# for cert-manager users who never run this), and this adds the one it has just written, once.
"$py" - "$here/kustomization.yaml" <<'EOF'
import re
import sys

path = sys.argv[1]
with open(path, encoding="utf-8") as f:
    lines = f.read().splitlines()
if any(re.fullmatch(r"\s*-\s*tls/?\s*(#.*)?", line) for line in lines):
    sys.exit(0)
key = re.compile(r"components:\s*(\[\s*\])?\s*(#.*)?")
at = next((i for i, line in enumerate(lines) if key.fullmatch(line)), None)
if at is None:
    lines += ["components:", "  - tls"]
else:
    indent = "  "
    if lines[at].split("#")[0].strip() == "components:":  # items below it: take their indentation
        below = [m.group(1) for m in map(re.compile(r"(\s*)-\s").match, lines[at + 1 :]) if m][:1]
        indent = below[0] if below and lines[at + 1].lstrip().startswith(("-", "#")) else indent
    lines[at] = "components:"
    lines.insert(at + 1, f"{indent}- tls")
with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
print(f"deploy/certs.sh: added '- tls' to the components of {path}", file=sys.stderr)
EOF
