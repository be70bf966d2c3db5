#!/bin/sh
# Print the path of the first interpreter among the arguments that is Python 3.11 or newer
# (SGLang 0.5.23 and pdkit need it; Ubuntu 22.04's python3 is 3.10), then its version; print
# nothing when none is. Read-only.
for candidate in "$@"; do
  path=$(command -v "$candidate" 2>/dev/null) || continue
  version=$("$path" -c 'import sys; print("%d.%d" % sys.version_info[:2]); sys.exit(sys.version_info < (3, 11))' 2>/dev/null) || continue
  echo "$path $version"
  exit 0
done
exit 0
