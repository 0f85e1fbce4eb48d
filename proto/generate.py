"""Regenerate the committed protobuf/gRPC modules from proto/v1/*.proto.

    python -m gosched.proto.generate            # rewrite proto/v1/*_pb2*.py(i) in place
    python -m gosched.proto.generate --out DIR  # write them under DIR instead (the staleness test)

protoc sees the sources through an include root in which they read gosched/proto/v1/x.proto, so
the generated cross-imports are `from gosched.proto.v1 import x_pb2`. The gRPC stubs carry no type
annotations, so each *_pb2_grpc.py gets a `# mypy: ignore-errors` line (the *_pb2.pyi stubs type
the messages).
"""

import argparse
import sys
import tempfile
from importlib import resources
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
SOURCES_DIR = PROTO_DIR / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
GRPC_HEADER = "# mypy: ignore-errors\n"


def sources() -> list[Path]:
    return sorted(SOURCES_DIR.glob("*.proto"))


def generate(out_dir: Path | None = None) -> list[Path]:
    """Generate into `out_dir` (default: proto/v1 itself); returns the files written."""
    from grpc_tools import protoc

    target = out_dir if out_dir is not None else SOURCES_DIR
    target.mkdir(parents=True, exist_ok=True)
    well_known = str(resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "include"
        (root / "gosched").mkdir(parents=True)
        (root / "gosched" / "proto").symlink_to(PROTO_DIR, target_is_directory=True)
        build = Path(tmp) / "out"
        build.mkdir()
        names = [f"gosched/proto/v1/{p.name}" for p in sources()]
        args = [
            "grpc_tools.protoc",
            f"-I{root}",
            f"-I{well_known}",
            f"--python_out={build}",
            f"--pyi_out={build}",
            f"--grpc_python_out={build}",
            *names,
        ]
        code = protoc.main(args)
        if code != 0:
            raise RuntimeError(f"protoc failed (exit {code}): {' '.join(args)}")
        written = []
        for path in sorted((build / "gosched" / "proto" / "v1").iterdir()):
            if not path.name.endswith(GENERATED_SUFFIXES):
                continue
            text = path.read_text()
            if path.name.endswith("_pb2_grpc.py"):
                text = GRPC_HEADER + text
            dest = target / path.name
            dest.write_text(text)
            written.append(dest)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write here instead of proto/v1")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
