"""The GPU machine's dry run, on the CPU: every package the GPU tests and benchmarks need is there or carried.

The GPU machine has no internet: what its image lacks travels as wheels listed in tests/gpu/wheels.txt. A
missing one used to be found only on the device, after a minute of start-up and a failed part (the fleet test
once failed at once for want of `openai`, the structured-output test for want of `xgrammar`). Here the imports
of everything a device run executes (tests/gpu/*.py, benchmarks/*.py and the two packages, followed through the
project's own modules, lazy imports inside functions included) are read from the source, mapped to their distributions, and
each must be in the image's list (tests/gpu/image_packages.txt) or carried; so must each carried wheel's own
requirements, where this machine has that wheel installed to read them from.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
LOCAL = {"tokenspeed", "console", "benchmarks", "tests"}
# Imported by code a device run never reaches, or only when present; each says why.
NOT_NEEDED_ON_GPU = {
    "ray": "the ray launcher: the GPU fleet test uses the local launcher",
    "llguidance": "--grammar-backend llguidance, an optional extra; the GPU tests use xgrammar",
    "schemathesis": "CPU fuzzing tests only",
    "pytest_textual_snapshot": "CPU snapshot tests only",
    "cudnn": "FlashInfer's cuDNN paths, imported only if present (left out for the tool's 64 MiB limit)",
    "nvidia-cudnn-frontend": "FlashInfer imports it only if present",
    "nvidia-cutlass-dsl": "FlashInfer's CuTe DSL kernels, imported only if present",
}
# Modules whose distribution is not installed on the CPU, so packages_distributions() cannot name it.
KNOWN_DISTRIBUTIONS = {"flashinfer": "flashinfer-python", "pynvml": "nvidia-ml-py", "zmq": "pyzmq"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _listed(path: Path) -> set[str]:
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(_norm(re.split(r"[=<>!~ ]", line, maxsplit=1)[0]))
    return names


def _module_file(module: str) -> Path | None:
    parts = module.split(".")
    for candidate in (ROOT.joinpath(*parts).with_suffix(".py"), ROOT.joinpath(*parts, "__init__.py")):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path) -> set[str]:
    """Absolute module names imported anywhere in the file (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)  # `from pkg import submodule`
    return found


def third_party_imports() -> dict[str, str]:
    """Top-level third-party module -> the first file that imports it, over what a device run executes."""
    # The GPU tests and benchmarks, and every module of the two packages: the fleet test runs `python -m
    # tokenspeed` (the console's CLI, its supervisor and `serve`) as processes, not through imports.
    todo = [*sorted((ROOT / "tests" / "gpu").glob("*.py")), *sorted((ROOT / "benchmarks").glob("*.py")),
            *sorted((ROOT / "tokenspeed").rglob("*.py")), *sorted((ROOT / "console").rglob("*.py"))]  # fmt: skip
    seen: set[Path] = set()
    external: dict[str, str] = {}
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for module in _imports(path):
            top = module.split(".")[0]
            if not top or top in sys.stdlib_module_names or top == "__future__":
                continue
            if top in LOCAL:
                target = _module_file(module)
                if target is not None:
                    todo.append(target)
                continue
            external.setdefault(top, str(path.relative_to(ROOT)))
    return external


def missing_modules(available: set[str]) -> list[str]:
    """What a device run imports that `available` (distribution names) lacks, each with its importer."""
    dists = md.packages_distributions()
    missing = []
    for module, where in sorted(third_party_imports().items()):
        if module in NOT_NEEDED_ON_GPU:
            continue
        names = [KNOWN_DISTRIBUTIONS[module]] if module in KNOWN_DISTRIBUTIONS else dists.get(module, [])
        assert names, f"{module} (imported by {where}) is installed nowhere here: add it to KNOWN_DISTRIBUTIONS"
        if not any(_norm(n) in available for n in names):
            missing.append(f"{module} ({'/'.join(names)}, imported by {where})")
    return missing


def test_every_module_a_device_run_imports_is_in_the_image_or_carried():
    available = _listed(ROOT / "tests/gpu/image_packages.txt") | _listed(ROOT / "tests/gpu/wheels.txt")
    missing = missing_modules(available)
    assert not missing, "not in the GPU image and not carried; add to tests/gpu/wheels.txt: " + ", ".join(missing)


def test_every_carried_wheel_has_its_requirements_there():
    available = _listed(ROOT / "tests/gpu/image_packages.txt") | _listed(ROOT / "tests/gpu/wheels.txt")
    gpu_python = {"python_version": "3.12", "python_full_version": "3.12.0", "sys_platform": "linux",
                  "platform_system": "Linux", "platform_machine": "x86_64", "extra": ""}  # fmt: skip
    missing, unread = [], []
    for wheel in sorted(_listed(ROOT / "tests/gpu/wheels.txt")):
        try:
            requires = md.requires(wheel) or []
        except md.PackageNotFoundError:
            unread.append(wheel)  # not installed on the CPU: its requirements cannot be read here
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(gpu_python):
                continue
            if _norm(req.name) not in available and _norm(req.name) not in NOT_NEEDED_ON_GPU:
                missing.append(f"{req.name} (needed by {wheel})")
    assert not missing, "carried wheels need these too; add to tests/gpu/wheels.txt: " + ", ".join(missing)
    assert len(unread) < len(_listed(ROOT / "tests/gpu/wheels.txt")) // 2, f"too few wheels readable: {unread}"


def test_the_dry_run_finds_a_package_left_out():
    """The check bites: with xgrammar and openai left out, the structured-output and fleet paths are reported."""
    available = _listed(ROOT / "tests/gpu/image_packages.txt") | _listed(ROOT / "tests/gpu/wheels.txt")
    missing = " ".join(missing_modules(available - {"xgrammar", "openai"}))
    assert "xgrammar" in missing and "openai" in missing, missing
