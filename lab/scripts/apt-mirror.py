#!/usr/bin/env python3
"""Build the lab's apt repository, as an air-gapped site's package mirror serves its hosts.

    lab/scripts/apt-mirror.py            build it (skipped when it is current)
    lab/scripts/apt-mirror.py --list     print the packages it would hold, download nothing

The packages are `lab_apt_packages` of lab/inventory/group_vars/all.yml (HAProxy for the gateway, ...) and
every package they depend on that the lab's image lacks, downloaded by this machine's apt from Debian 12, the
release of the lab's hosts. The repository is indexed with apt-ftparchive and signed with the lab's own key
(made here once, in .cache/lab/apt-gnupg); the lab's hosts trust that key only (lab/playbooks/lab_hosts.yml).
Result: .cache/connected/debian/ (pool/, dists/bookworm/{InRelease,Release,Release.gpg,main/binary-ARCH/Packages*},
vllm-lab-archive-keyring.gpg), which the lab's bundle carries to the lab's mirror (lab/scripts/bundle.sh), where
lab-mirror serves it at http://<mirror>/debian.
"""

import argparse
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("CACHE_DIR", ROOT / ".cache"))
REPO = CACHE / "connected" / "debian"
GNUPG = CACHE / "lab" / "apt-gnupg"
KEYRING = "vllm-lab-archive-keyring.gpg"
SUITE = "bookworm"
IMAGE = os.environ.get("LAB_IMAGE", "localhost/debian12-systemd")
KEY_NAME = "vllm-fleet lab package mirror <lab-mirror@vllm-fleet.invalid>"


def run(*cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def need(tool, package):
    if shutil.which(tool) is None:
        sys.exit(f"apt-mirror: {tool} is missing; fix: apt-get install {package} (scripts/bootstrap.sh installs it)")


def wanted_packages():
    group_vars = yaml.safe_load((ROOT / "lab" / "inventory" / "group_vars" / "all.yml").read_text())
    return sorted(group_vars.get("lab_apt_packages") or [])


def image_packages():
    """What the lab's image already has: those come from the image, not from the mirror."""
    try:
        out = run("podman", "run", "--rm", "--network", "none", IMAGE, "dpkg-query", "-W", "-f", "${Package}\n")
    except subprocess.CalledProcessError as exc:
        sys.exit(f"apt-mirror: cannot list the packages of {IMAGE}: {exc.stderr.strip()}; fix: scripts/bootstrap.sh")
    return set(out.split())


def closure(packages):
    """The packages and everything they depend on (recursively), real package names only."""
    out = run(
        "apt-cache",
        "depends",
        "--recurse",
        "--no-recommends",
        "--no-suggests",
        "--no-conflicts",
        "--no-breaks",
        "--no-replaces",
        "--no-enhances",
        *packages,
    )
    return {line.strip() for line in out.splitlines() if line and not line.startswith((" ", "<"))}


def candidates(packages):
    """{package: the version apt would download}; exits naming a package apt does not know."""
    out = run("apt-cache", "policy", *packages)
    versions, current = {}, None
    for line in out.splitlines():
        if not line.startswith(" "):
            current = line.rstrip(":")
        elif line.strip().startswith("Candidate:") and current:
            versions[current] = line.split(":", 1)[1].strip()
    missing = [p for p in packages if versions.get(p) in (None, "(none)")]
    if missing:
        sys.exit(
            f"apt-mirror: apt knows no candidate for {missing}; fix: apt-get update (or check the names in "
            "lab_apt_packages)"
        )
    return versions


def signing_key():
    GNUPG.mkdir(parents=True, exist_ok=True, mode=0o700)
    env = dict(os.environ, GNUPGHOME=str(GNUPG))
    if not run("gpg", "--batch", "--list-secret-keys", env=env).strip():
        run(
            "gpg",
            "--batch",
            "--pinentry-mode",
            "loopback",
            "--passphrase",
            "",
            "--quick-gen-key",
            KEY_NAME,
            "ed25519",
            "sign",
            "never",
            env=env,
        )
    return env


def build(packages, versions, arch):
    pool = REPO / "pool"
    if REPO.exists():
        shutil.rmtree(REPO)
    pool.mkdir(parents=True)
    run("apt-get", "download", "-q", *[f"{p}={versions[p]}" for p in packages], cwd=pool)
    binary = REPO / "dists" / SUITE / "main" / f"binary-{arch}"
    binary.mkdir(parents=True)
    index = run("apt-ftparchive", "packages", "pool", cwd=REPO)
    (binary / "Packages").write_text(index)
    with gzip.GzipFile(binary / "Packages.gz", "wb", mtime=0) as handle:
        handle.write(index.encode())
    release = run(
        "apt-ftparchive",
        "-o",
        "APT::FTPArchive::Release::Origin=vllm-fleet-lab",
        "-o",
        "APT::FTPArchive::Release::Label=vllm-fleet lab mirror",
        "-o",
        f"APT::FTPArchive::Release::Suite={SUITE}",
        "-o",
        f"APT::FTPArchive::Release::Codename={SUITE}",
        "-o",
        "APT::FTPArchive::Release::Components=main",
        "-o",
        f"APT::FTPArchive::Release::Architectures={arch}",
        "release",
        f"dists/{SUITE}",
        cwd=REPO,
    )
    dist = REPO / "dists" / SUITE
    (dist / "Release").write_text(release)
    env = signing_key()
    run("gpg", "--batch", "--yes", "--clearsign", "-o", str(dist / "InRelease"), str(dist / "Release"), env=env)
    run("gpg", "--batch", "--yes", "-abs", "-o", str(dist / "Release.gpg"), str(dist / "Release"), env=env)
    key = subprocess.run(["gpg", "--batch", "--export"], check=True, capture_output=True, env=env).stdout
    (REPO / KEYRING).write_bytes(key)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--list", action="store_true", help="print the packages it would hold and stop")
    args = parser.parse_args()
    for tool, package in (("apt-ftparchive", "apt-utils"), ("gpg", "gnupg"), ("podman", "podman")):
        need(tool, package)
    wanted = wanted_packages()
    base = image_packages()
    packages = sorted(closure(wanted) - base) if wanted else []
    versions = candidates(packages) if packages else {}
    if args.list:
        print("\n".join(f"{p}={versions[p]}" for p in packages))
        return
    arch = run("dpkg", "--print-architecture").strip()
    stamp = hashlib.sha256(json.dumps([versions, arch, SUITE], sort_keys=True).encode()).hexdigest()[:16]
    stamp_file = REPO / ".stamp"
    if stamp_file.exists() and stamp_file.read_text() == stamp and (REPO / KEYRING).exists():
        print(f"apt mirror is current ({len(packages)} packages, {stamp})")
        return
    build(packages, versions, arch)
    stamp_file.write_text(stamp)
    size = sum(f.stat().st_size for f in (REPO / "pool").iterdir())
    print(f"apt mirror: {len(packages)} packages ({size / 2**20:.1f} MiB) for {', '.join(wanted)}, signed, in {REPO}")


if __name__ == "__main__":
    main()
