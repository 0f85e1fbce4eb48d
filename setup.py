"""Maps each top-level component folder under the single `gosched` import namespace.

`package-dir` makes `gosched.dispatcher` live in `dispatcher/` (and so on) for both
plain and editable installs; sub-packages are discovered, so a new one needs no edit here.
"""

from setuptools import find_packages, setup

# Top-level folders that are parts of the `gosched` package (tests/, deploy/, docs/ are not).
COMPONENTS = (
    "common",
    "dispatcher",
    "scheduler_shard",
    "binder",
    "proto",
    "runtime",
    "bench",
    "agent",
    "cli",
    "api",
)

package_dir = {"gosched": "gosched"}
packages = ["gosched"]
for component in COMPONENTS:
    package_dir[f"gosched.{component}"] = component
    packages.append(f"gosched.{component}")
    packages.extend(f"gosched.{component}.{sub}" for sub in find_packages(component))

if __name__ == "__main__":
    setup(
        package_dir=package_dir, packages=packages, package_data={"gosched.proto": ["*.proto", "**/*.proto"]}
    )
