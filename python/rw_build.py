"""rw_build.py - the PEP 517 build backend of the rw_client package, in the standard library
only: a wheel is a zip of rw_client/*.py (+ py.typed), rw_client/_checkout.py naming the rw
checkout it was built from (so the installed package finds that checkout's librw_client.so and
rw-worker under build*/), and the .dist-info files (METADATA from pyproject.toml, WHEEL, RECORD).
Why not setuptools: a fresh virtual environment without network access has no `wheel` package,
which setuptools needs to build one."""

import base64
import hashlib
import os
import re
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
NAME, DIST = "rw_client", "rw_client"


def _project():
    """name, version, summary, requires-python, readme text: read from pyproject.toml."""
    text = open(os.path.join(HERE, "pyproject.toml"), encoding="utf-8").read()
    proj = text.split("[project]", 1)[1].split("\n[", 1)[0]

    def field(key):
        m = re.search(r'^%s\s*=\s*"([^"]*)"' % key, proj, re.M)
        return m.group(1) if m else ""

    readme = open(os.path.join(HERE, field("readme")), encoding="utf-8").read()
    return field("name"), field("version"), field("description"), field("requires-python"), readme


def _metadata():
    name, version, summary, requires, readme = _project()
    return version, ("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: %s\n"
                     "License: Apache-2.0\nRequires-Python: %s\nProvides-Extra: torch\n"
                     "Requires-Dist: torch ; extra == \"torch\"\n"
                     "Description-Content-Type: text/markdown\n\n%s"
                     % (name, version, summary, requires, readme))


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d\n" % (arcname, digest, len(data))


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    version, meta = _metadata()
    info = "%s-%s.dist-info" % (DIST, version)
    os.makedirs(os.path.join(metadata_directory, info), exist_ok=True)
    with open(os.path.join(metadata_directory, info, "METADATA"), "w", encoding="utf-8") as f:
        f.write(meta)
    return info


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version, meta = _metadata()
    info = "%s-%s.dist-info" % (DIST, version)
    wheel = "%s-%s-py3-none-any.whl" % (DIST, version)
    files = []
    pkg = os.path.join(HERE, NAME)
    for fn in sorted(os.listdir(pkg)):
        if fn.endswith(".py") or fn == "py.typed":
            if fn == "_checkout.py":
                continue
            with open(os.path.join(pkg, fn), "rb") as f:
                files.append(("%s/%s" % (NAME, fn), f.read()))
    files.append(("%s/_checkout.py" % NAME,
                  ('"""The rw checkout this package was built from (rw_build.py)."""\n'
                   "REPO = %r\n" % os.path.dirname(HERE)).encode()))
    files.append(("%s/METADATA" % info, meta.encode("utf-8")))
    files.append(("%s/WHEEL" % info, b"Wheel-Version: 1.0\nGenerator: rw_build\n"
                                     b"Root-Is-Purelib: true\nTag: py3-none-any\n"))
    record = "".join(_record_line(a, d) for a, d in files) + "%s/RECORD,,\n" % info
    os.makedirs(wheel_directory, exist_ok=True)
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w", zipfile.ZIP_DEFLATED) as z:
        for arcname, data in files:
            z.writestr(arcname, data)
        z.writestr("%s/RECORD" % info, record)
    return wheel
