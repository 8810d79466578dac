"""Fetch what the lmdeploy-engine lane carries to the GPU machine, here, where the network is:

    python scripts/lmdeploy/fetch.py [--dest .lmdeploy_gpu] [--update-sums] [--cpu-site]

1. `pip download` LMDeploy 0.18.0's wheel for the H200 machines (CPython 3.12, manylinux) into
   DEST/download/ (107 MB: it stays here).
2. Strip it to its Python: DEST/carry/lmdeploy-0.18.0-pytorch.tar.gz holds every file of the wheel
   but TurboMind's binaries (lmdeploy/turbomind/_turbomind*.so and lmdeploy/turbomind/lib64/, 364
   MB unpacked, which the PyTorch engine never loads; the Python modules of lmdeploy/turbomind/
   stay: other modules import them). Written byte for byte the same on every run (sorted
   members, no times, no owners), so its hash is a fact to commit.
3. `pip download` the wheels of scripts/lmdeploy/wheels.txt for the same platform into
   DEST/carry/wheels/.
4. Check everything in DEST/carry against scripts/lmdeploy/SHA256SUMS (the committed hashes; with
   --update-sums, write them instead), and print what one device call will carry.

With --cpu-site, also make DEST/cpu_site: LMDeploy's Python and what importing its config and
graph-runner modules needs, for this machine's Python, so that the policy test
(plugins/lmdeploy-engine/tests/test_lmdeploy_policy.py) checks the policy against LMDeploy's own
functions without a GPU. Exit status: 0 when the carry matches the hashes, 1 when not, 2 on a
failed download.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "scripts" / "lmdeploy"
LMDEPLOY = "lmdeploy==0.18.0"
TARBALL = "lmdeploy-0.18.0-pytorch.tar.gz"
STRIPPED = ("lmdeploy/turbomind/_turbomind", "lmdeploy/turbomind/lib64/")
PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
            "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64"]
CARRY_LIMIT = 64 * 2**20  # one device call carries at most this, the repository (~8 MB) included
# What importing lmdeploy.pytorch.config and its graph runner needs on a CPU machine that has the
# project's own dependencies (torch, transformers, pydantic, numpy): found by trying the imports.
CPU_SITE_NEEDS = ["addict", "apache-tvm-ffi==0.1.11", "fire", "mmengine-lite", "partial-json-parser", "platformdirs",
                  "pybase64", "pyzmq", "shortuuid", "termcolor", "xgrammar==0.2.9", "yapf", "einops", "psutil"]


def pip(*args: str) -> None:
    command = [sys.executable, "-m", "pip", *args]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        print(f"fetch: {' '.join(command)} failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}", file=sys.stderr)
        sys.exit(2)


def download(specs: list[str], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    pip("download", "--quiet", "--no-deps", "--only-binary=:all:", *PLATFORM, "-d", str(folder), *specs)


def wheel_specs() -> list[str]:
    lines = (HERE / "wheels.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def strip_wheel(wheel: Path, tarball: Path) -> int:
    """The wheel's members but TurboMind's binaries, as a reproducible tar.gz; returns the count."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(wheel) as source, tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        names = sorted(n for n in source.namelist() if not n.endswith("/") and not n.startswith(STRIPPED))
        for name in names:
            data = source.read(name)
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    with open(tarball, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0, filename="") as gz:
        gz.write(buffer.getvalue())
    return len(names)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def carried(dest: Path) -> list[Path]:
    carry = dest / "carry"
    return sorted([carry / TARBALL] + list((carry / "wheels").glob("*.whl")))


def make_cpu_site(dest: Path, tarball: Path) -> Path:
    site = dest / "cpu_site"
    pip("install", "--quiet", "--no-deps", "--target", str(site), "--upgrade", *CPU_SITE_NEEDS)
    with tarfile.open(tarball) as tar:
        tar.extractall(site, filter="data")
    return site


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", default=str(ROOT / ".lmdeploy_gpu"))
    parser.add_argument("--update-sums", action="store_true", help="write scripts/lmdeploy/SHA256SUMS from this fetch")
    parser.add_argument("--cpu-site", action="store_true", help="also make DEST/cpu_site for the CPU policy test")
    args = parser.parse_args(argv)
    dest = Path(args.dest).resolve()
    download([LMDEPLOY], dest / "download")
    wheel = next((dest / "download").glob("lmdeploy-0.18.0-*.whl"))
    (dest / "carry").mkdir(parents=True, exist_ok=True)
    count = strip_wheel(wheel, dest / "carry" / TARBALL)
    print(f"fetch: {wheel.name} ({wheel.stat().st_size / 2**20:.1f} MiB) -> carry/{TARBALL} ({count} files, "
          f"TurboMind's binaries left out)")
    download(wheel_specs(), dest / "carry" / "wheels")
    files = carried(dest)
    lines = [f"{sha256(f)}  {f.relative_to(ROOT)}" for f in files]
    sums = HERE / "SHA256SUMS"
    if args.update_sums:
        sums.write_text("\n".join(lines) + "\n")
        print(f"fetch: wrote {sums.relative_to(ROOT)} ({len(lines)} files)")
    total = sum(f.stat().st_size for f in files)
    print(f"fetch: {len(files)} files, {total / 2**20:.1f} MiB to carry (device call: carry "
          f"['{(dest / 'carry').relative_to(ROOT)}'], limit {CARRY_LIMIT / 2**20:.0f} MiB with the repository)")
    if args.cpu_site:
        print(f"fetch: CPU site for the policy test in {make_cpu_site(dest, dest / 'carry' / TARBALL)}")
    committed = sums.read_text().splitlines() if sums.exists() else []
    if sorted(committed) != sorted(lines):
        print("fetch: the carry differs from scripts/lmdeploy/SHA256SUMS:\n  committed: " + "\n             ".join(
            sorted(set(committed) - set(lines)) or ["-"]) + "\n  fetched:   " + "\n             ".join(
            sorted(set(lines) - set(committed)) or ["-"]), file=sys.stderr)
        return 1
    print("fetch: every carried file matches scripts/lmdeploy/SHA256SUMS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
