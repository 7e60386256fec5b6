"""Which packages the wheel holds, found rather than listed: the core (`fincheck/`, every task
folder under `fincheck/tasks/` included) and the stage folders at the top of the repo, which
install under the one namespace (data_prep/ -> fincheck.data_prep, train/ -> fincheck.train,
eval/ -> fincheck.eval, serve/ -> fincheck.serve). pyproject.toml holds everything else; a new
task or sub-package needs no line here."""

from setuptools import find_packages, setup

STAGES = ("data_prep", "train", "eval", "serve")

packages = find_packages(include=["fincheck", "fincheck.*"])
for stage in STAGES:
    packages += [f"fincheck.{stage}", *(f"fincheck.{stage}.{p}" for p in find_packages(stage))]

setup(
    packages=packages,
    package_dir={"fincheck": "fincheck", **{f"fincheck.{stage}": stage for stage in STAGES}},
)
