#!/usr/bin/env bash
# Validates deploy/k8s/*.yaml against the Kubernetes API schema (strict: unknown fields
# are errors), offline, with the kubernetes-validate package (its schemas ship inside it),
# and checks that each pod's configuration in the ConfigMap is one `keel server` accepts.
#
#   deploy/k8s/validate.sh [KUBERNETES_VERSION]     # default 1.30.0
set -euo pipefail
cd "$(dirname "$0")/../.."
version=${1:-1.30.0}
if ! command -v kubernetes-validate >/dev/null 2>&1; then
    python3 -m pip install --quiet kubernetes-validate \
        || python3 -m pip install --quiet --break-system-packages kubernetes-validate
fi
kubernetes-validate --strict --kubernetes-version "$version" deploy/k8s/*.yaml
# The ConfigMap's node configurations, through the server's own validation.
keel=${KEEL_BIN:-target/release/keel}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$dir" deploy/k8s/keel.yaml <<'PY'
import sys, yaml
out, path = sys.argv[1], sys.argv[2]
for doc in yaml.safe_load_all(open(path)):
    if doc and doc.get("kind") == "ConfigMap":
        for name, text in doc["data"].items():
            open(f"{out}/{name}", "w").write(text)
PY
for file in "$dir"/*.toml; do
    "$keel" server --config "$file" --check
    echo "$(basename "$file"): a valid keel server configuration"
done
