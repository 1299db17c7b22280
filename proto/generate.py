"""Generate the Python gRPC code and typed stubs from proto/ into genproto/.

    python proto/generate.py            # regenerate genproto/ in place
    python proto/generate.py --out DIR  # generate elsewhere (the staleness test does)

protoc writes imports as `from reminders.v1 import ...`; they are rewritten to
`from genproto.reminders.v1 import ...` so the generated code lives in one package of its
own, apart from hand-written code (and excluded from ruff and mypy).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

from grpc_tools import protoc

PROTO_ROOT = Path(__file__).resolve().parent
# Google's annotations, vendored for buf: their Python code comes from the pinned
# googleapis-common-protos (google.api.field_behavior_pb2), so none is generated here.
THIRD_PARTY = PROTO_ROOT / "third_party"
PACKAGE = "genproto"
_IMPORT = re.compile(r"^(from|import) (reminders|notification)\.", re.MULTILINE)


def proto_files() -> list[Path]:
    return sorted(p for p in PROTO_ROOT.rglob("*.proto") if THIRD_PARTY not in p.parents)


def generate(out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    include = Path(protoc.__file__).parent / "_proto"
    bin_dir = Path(sys.executable).parent  # mypy-protobuf's plugins live beside python
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{THIRD_PARTY}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        *(str(path.relative_to(PROTO_ROOT)) for path in proto_files()),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    for path in out.rglob("*.py*"):
        path.write_text(_IMPORT.sub(rf"\1 {PACKAGE}.\2.", path.read_text()))
    for directory in [out, *(p for p in out.rglob("*") if p.is_dir())]:
        (directory / "__init__.py").touch()
    (out / "__init__.py").write_text(
        '"""Generated from proto/ by proto/generate.py. Do not edit."""\n'
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROTO_ROOT.parent / PACKAGE)
    generate(parser.parse_args().out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
