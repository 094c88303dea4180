"""What every fuzz target shares: running under atheris (coverage-guided) or replaying a corpus without it.

A target module defines ``test_one_input(data: bytes) -> None``, which raises only when it found a bug
(any exception it lets escape is a crash), and calls :func:`main` with its name. Run from the repository
root:

    python -m fuzz.fuzz_frames [libFuzzer flags] [corpus dirs]   # atheris, if installed
    python -m fuzz.fuzz_frames --replay [files or dirs]          # no atheris: corpus + random mutations

See fuzz/README.md.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

CORPUS_ROOT = Path(__file__).parent / "corpus"
REPLAY_MUTATIONS = int(os.environ.get("STROM_FUZZ_REPLAY_MUTATIONS", "2000"))
"""Random mutations of the corpus that ``--replay`` runs after the corpus itself."""

try:
    import atheris
except ImportError:  # an optional extra: pip install -e '.[fuzz]'
    atheris = None


def _canonical(value: Any) -> Any:
    """A value with every float NaN replaced by a marker, so equal values compare equal."""
    if isinstance(value, float) and math.isnan(value):
        return ("NaN",)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def batches_identical(a: pa.RecordBatch, b: pa.RecordBatch) -> bool:
    """Equal schemas and values: top-level floats by bit pattern, NaN equal to NaN at any depth (Arrow's
    ``equals`` says NaN != NaN)."""
    from strom.records.arrow_python import _physical_type  # late: targets import strom under instrumentation

    if a.schema != b.schema or a.num_rows != b.num_rows:
        return False
    for x, y in zip(a.columns, b.columns, strict=True):
        if pa.types.is_float32(x.type):
            x, y = x.view(pa.int32()), y.view(pa.int32())
        elif pa.types.is_float64(x.type):
            x, y = x.view(pa.int64()), y.view(pa.int64())
        if x.equals(y):
            continue
        # a nested NaN: compare the values, temporal ones as integers (dates beyond year 9999 have no
        # Python equivalent)
        physical = _physical_type(x.type)
        if _canonical(x.view(physical).to_pylist()) != _canonical(y.view(physical).to_pylist()):
            return False
    return True


def corpus_dir(name: str) -> Path:
    return CORPUS_ROOT / name


def corpus(name: str) -> list[bytes]:
    """The seed inputs of target ``name``, in a stable order."""
    return [path.read_bytes() for path in sorted(corpus_dir(name).iterdir()) if path.is_file()]


@contextlib.contextmanager
def instrumented() -> Iterator[None]:
    """Imports inside get atheris' coverage instrumentation (a no-op without atheris)."""
    if atheris is None:
        yield
        return
    with atheris.instrument_imports(include=["strom"]):
        yield


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One to three byte-level mutations, like libFuzzer's simplest ones (for replay without atheris)."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(6)
        if kind == 0 and out:
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        elif kind == 1 and out:
            out[rng.randrange(len(out))] = rng.choice((0, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        elif kind == 2:
            del out[rng.randint(0, len(out)) :]
        elif kind == 3:
            index = rng.randint(0, len(out))
            out[index:index] = rng.randbytes(rng.randint(1, 8))
        elif kind == 4 and len(out) >= 4:
            index = rng.randrange(len(out) - 3)
            value = rng.choice((-(2**31), -1, 0, 1, 255, 2**16, 2**31 - 1))
            out[index : index + 4] = value.to_bytes(4, rng.choice(("little", "big")), signed=True)
        elif out:
            start = rng.randrange(len(out))
            out[start:start] = out[start : start + rng.randint(1, 16)]
    return bytes(out)


def replay(test_one_input: Callable[[bytes], None], inputs: list[bytes], mutations: int, seed: int) -> int:
    """Run the inputs, then ``mutations`` random mutations of them; returns the number of runs."""
    for data in inputs:
        test_one_input(data)
    rng = random.Random(seed)
    for _ in range(mutations if inputs else 0):
        data = mutate(rng, rng.choice(inputs))
        try:
            test_one_input(data)
        except Exception:
            print(f"crash input (seed {seed}): {data.hex()}", file=sys.stderr)
            raise
    return len(inputs) + (mutations if inputs else 0)


def _read_inputs(paths: list[str]) -> list[bytes]:
    inputs = []
    for arg in paths:
        path = Path(arg)
        files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
        inputs += [p.read_bytes() for p in files]
    return inputs


def main(name: str, test_one_input: Callable[[bytes], None]) -> None:
    args = sys.argv[1:]
    if atheris is None or "--replay" in args:
        paths = [a for a in args if a != "--replay" and not a.startswith("-")] or [str(corpus_dir(name))]
        seed = int(os.environ.get("STROM_FUZZ_SEED", random.randrange(1 << 30)))
        runs = replay(test_one_input, _read_inputs(paths), REPLAY_MUTATIONS, seed)
        print(f"{name}: {runs} inputs replayed without a crash (seed {seed}; atheris "
              f"{'not installed' if atheris is None else 'not used'})")
        return
    atheris.Setup([sys.argv[0], *args], test_one_input)
    atheris.Fuzz()
