#!/usr/bin/env bash
# Build the Cloud Functions source archive that `gcloud functions deploy --source` and
# Terraform's google_storage_bucket_object upload: main.py and requirements.txt at the top, the
# looprelay package vendored beside them with its bundled templates (pyproject.toml maps the
# top-level templates/ to looprelay.templates).
#
# Reproducible: two builds of the same tree are byte-identical. Entries are sorted, every
# timestamp is SOURCE_DATE_EPOCH (default 1980-01-01, the earliest a zip can hold), every mode
# 0644, no __pycache__ or other stray files, and one zlib level.
#
# Usage: functions/build.sh [OUT]    (default: build/functions-source.zip)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build/functions-source.zip}

"${PYTHON:-python3}" - "$root" "$out" <<'PY'
import hashlib
import os
import sys
import time
import zipfile
from pathlib import Path

ZIP_EPOCH = 315532800  # 1980-01-01T00:00:00Z
root, out = Path(sys.argv[1]), Path(sys.argv[2])
stamp = time.gmtime(max(int(os.environ.get("SOURCE_DATE_EPOCH", ZIP_EPOCH)), ZIP_EPOCH))[:6]


def members():
    yield "main.py", root / "functions" / "main.py"
    yield "requirements.txt", root / "functions" / "requirements.txt"
    package = root / "shared" / "looprelay"
    for path in package.rglob("*"):
        if path.is_file() and (path.suffix == ".py" or path.name == "py.typed"):
            if "__pycache__" not in path.parts:
                yield "looprelay/" + path.relative_to(package).as_posix(), path
    for path in (root / "templates").iterdir():
        if path.is_file() and (path.name == "__init__.py" or path.suffix == ".j2"):
            yield "looprelay/templates/" + path.name, path


entries = sorted(members())
names = [name for name, _ in entries]
if len(set(names)) != len(names):
    sys.exit("build.sh: two files map to one archive path; is there a shared/looprelay/templates?")
out.parent.mkdir(parents=True, exist_ok=True)
partial = out.with_name(out.name + ".partial")
with zipfile.ZipFile(partial, "w") as archive:
    for name, path in entries:
        info = zipfile.ZipInfo(name, date_time=stamp)
        info.create_system = 3  # Unix, so external_attr carries the mode
        info.external_attr = 0o100644 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        archive.writestr(info, path.read_bytes(), compresslevel=9)
partial.replace(out)
digest = hashlib.sha256(out.read_bytes()).hexdigest()
print(f"{out}: {len(entries)} files, sha256 {digest}")
PY
