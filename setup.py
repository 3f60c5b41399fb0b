# Maps the top-level kernels/ and dashboards/ folders to import names that
# cannot clash with unrelated PyPI packages (there is a `kernels` on PyPI).
# pyproject.toml carries everything else; this file only lists packages.
from setuptools import find_packages, setup

ALIASES = {"archsearch_kernels": "kernels", "archsearch_dashboards": "dashboards"}

packages = find_packages(include=["archsearch", "archsearch.*"])
package_dir = {}
for alias, folder in ALIASES.items():
    for sub in [""] + ["." + p for p in find_packages(where=folder)]:
        packages.append(alias + sub)
    package_dir[alias] = folder

setup(packages=packages, package_dir=package_dir)
