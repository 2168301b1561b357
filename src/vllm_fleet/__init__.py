# vllm_fleet: controller-side logic (profiles, rendering, planning, metrics).
# The project's version, its one home: pyproject.toml reads it (setuptools' attr:, without importing the package), and
# the bundle, the SBOM, plan.json and every report state it; tests/unit/test_version.py fails where another file
# states another. Semantic versioning; each release is a section of CHANGELOG.md and a tag vX.Y.Z.
__version__ = "0.3.0"
