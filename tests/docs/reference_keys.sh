#!/usr/bin/env bash
# The `docs` tier's key coverage: every configuration key that `TRAINER --help-config` prints is
# named, as section.key, in docs/reference.md (the place for every key: issue 37).
#   reference_keys.sh TRAINER SOURCE_DIR
set -uo pipefail
trainer=$1 src=$2
reference=$src/docs/reference.md
if ! keys=$("$trainer" --help-config | awk 'NR > 1 { print $1 }') || [ -z "$keys" ]; then
  echo "FAIL: $trainer --help-config printed no keys"
  exit 1
fi
missing=()
while read -r key; do
  # Named: the key between backticks, or as the start of a `key: value` or `key=value`.
  grep -qE -- "\`${key//./\\.}([\`:= ]|\$)" "$reference" || missing+=("$key")
done <<<"$keys"
if [ ${#missing[@]} -gt 0 ]; then
  echo "FAIL: docs/reference.md does not name ${#missing[@]} key(s) of --help-config: ${missing[*]}"
  exit 1
fi
echo "PASS: docs/reference.md names all $(wc -l <<<"$keys") keys of --help-config"
