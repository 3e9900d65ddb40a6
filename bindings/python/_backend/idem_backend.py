"""Builds the idem Python package: a PEP 517 backend, and `inplace` for the tree.

The package is pure Python over two small extensions, compiled here with
the C compiler Python was built with: idem._native, which cffi generates in
API mode from the declarations in idem_cdef.py, and idem._speedups
(idem_speedups.c), which answers a replay in one call from Python. libidem is
found in this order:

  1. IDEM_BUILD_DIR, or the tree's own build/ folder: libidem.a is linked
     in statically (the package then needs no libidem at run time);
  2. an installed libidem, through `pkg-config idem` (linked as a shared
     library), also when IDEM_LIBIDEM=pkg-config is set.

The build needs cffi, a C compiler and Python's headers, nothing from a
package index: pip's build isolation hides the interpreter's own
site-packages, so cffi is looked for there too.

    python3 idem_backend.py inplace [--build-dir DIR] --out DIR

builds the package into DIR/idem, for tests run from the tree.
"""
import base64
import hashlib
import os
import re
import shlex
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_ROOT = os.path.dirname(HERE)
TREE = os.path.dirname(os.path.dirname(PKG_ROOT))
sys.path.insert(0, HERE)
import idem_cdef  # noqa: E402  (next to this file)

NAME = "idem"


def _project():
    """Version, summary and dependencies, read from pyproject.toml."""
    text = open(os.path.join(PKG_ROOT, "pyproject.toml"), encoding="utf-8").read()

    def field(name):
        m = re.search(r'^%s\s*=\s*"([^"]*)"' % name, text, re.M)
        return m.group(1) if m else ""

    deps = re.search(r"^dependencies\s*=\s*\[([^\]]*)\]", text, re.M)
    requires = re.findall(r'"([^"]+)"', deps.group(1)) if deps else []
    return field("version"), field("description"), field("requires-python"), requires


def _licence():
    """The licence's name and the classifiers (the licence's among them),
    from pyproject.toml."""
    text = open(os.path.join(PKG_ROOT, "pyproject.toml"), encoding="utf-8").read()
    m = re.search(r'^license\s*=\s*\{\s*text\s*=\s*"([^"]*)"', text, re.M)
    block = re.search(r"^classifiers\s*=\s*\[([^\]]*)\]", text, re.M)
    classifiers = re.findall(r'"([^"]+)"', block.group(1)) if block else []
    return (m.group(1) if m else ""), classifiers


def _licence_file():
    """The project's LICENSE: beside the package in an sdist, else the
    tree's."""
    for p in (os.path.join(PKG_ROOT, "LICENSE"), os.path.join(TREE, "LICENSE")):
        if os.path.exists(p):
            return p
    return None


def _header_dir():
    """The folder holding idem.h: the sdist's include/ (build_sdist puts it
    there), else the tree's."""
    for d in (os.path.join(PKG_ROOT, "include"), os.path.join(TREE, "include")):
        if os.path.exists(os.path.join(d, "idem.h")):
            return d
    return None


def _in_bare_venv():
    """Whether this Python is a venv that does not see the system's
    packages (made without --system-site-packages)."""
    if sys.prefix == getattr(sys, "base_prefix", sys.prefix):
        return False
    cfg = os.path.join(sys.prefix, "pyvenv.cfg")
    try:
        text = open(cfg, encoding="utf-8").read()
    except OSError:
        return False
    return re.search(r"^include-system-site-packages\s*=\s*true", text, re.M | re.I) is None


def _missing(what, debian):
    """How to get a missing build dependency, for this interpreter: in a venv
    that does not see the system's packages, Debian's package is no help."""
    if _in_bare_venv():
        return ("idem: building the Python package needs %s, which this venv (%s) does "
                "not have and cannot see: `pip install %s` into it (from a package "
                "index), or make the venv with `python3 -m venv --system-site-packages` "
                "after `apt-get install %s` (Debian)" % (what, sys.prefix, what, debian))
    return ("idem: building the Python package needs %s for %s (Debian: apt-get install "
            "%s; elsewhere: pip install %s)" % (what, sys.executable, debian, what))


def _import_cffi():
    try:
        import cffi
    except ImportError:
        paths = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
        paths += [sysconfig.get_paths()[k] for k in ("platlib", "purelib")]
        for p in paths:
            if os.path.isdir(p) and p not in sys.path:
                sys.path.append(p)
        try:
            import cffi
        except ImportError:
            raise SystemExit(_missing("cffi", "python3-cffi"))
    return cffi


def _pkg_config(*args):
    try:
        out = subprocess.run(["pkg-config", *args], check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return shlex.split(out)


def _libidem(build_dir=None):
    """(cflags, libs, has_pg): how to compile and link against libidem."""
    mode = os.environ.get("IDEM_LIBIDEM", "")
    build = build_dir or os.environ.get("IDEM_BUILD_DIR") or os.path.join(TREE, "build")
    has_pg = _pkg_config("--exists", "libpq") is not None
    headers = _header_dir()
    if mode != "pkg-config" and os.path.exists(os.path.join(build, "libidem.a")) \
            and headers is not None:
        deps = ["jansson", "sqlite3", "libcrypto"] + (["libpq"] if has_pg else [])
        libs = _pkg_config("--libs", *deps)
        if libs is None:
            raise SystemExit("idem: pkg-config does not find %s" % " ".join(deps))
        cflags = ["-I" + headers]
        cflags += _pkg_config("--cflags", *deps) or []
        # libidem.a goes in whole and stays private to the extension.
        return (cflags, [os.path.join(build, "libidem.a"), *libs, "-lpthread",
                         "-Wl,--exclude-libs,ALL"], has_pg)
    cflags = _pkg_config("--cflags", "idem")
    if cflags is None:
        raise SystemExit(
            "idem: libidem not found: build the tree first (make build; or "
            "set IDEM_BUILD_DIR to the build folder that holds libidem.a, as an "
            "sdist needs), or install libidem so that `pkg-config idem` finds it")
    mods = ["idem", "sqlite3"] + (["libpq"] if has_pg else [])
    cflags = _pkg_config("--cflags", *mods) or cflags
    libs = _pkg_config("--libs", *mods) or ["-lidem", "-lsqlite3"]
    libdir = (_pkg_config("--variable=libdir", "idem") or [""])[0]
    if libdir and libdir not in ("/usr/lib", "/usr/lib64", "/lib"):
        libs.append("-Wl,-rpath," + libdir)
    return cflags, libs, has_pg


def _compile(dest_pkg, build_dir=None):
    """Generates and compiles idem._native into the folder dest_pkg."""
    cffi = _import_cffi()
    cflags, libs, has_pg = _libidem(build_dir)
    ffi = cffi.FFI()
    ffi.cdef(idem_cdef.cdef(has_pg))
    ffi.set_source("idem._native", idem_cdef.source(has_pg))
    ext = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    out = os.path.join(dest_pkg, "_native" + ext)
    with tempfile.TemporaryDirectory(prefix="idem-py-") as tmp:
        c_file = os.path.join(tmp, "_native.c")
        ffi.emit_c_code(c_file)
        cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
        include = sysconfig.get_paths()["include"]
        if not os.path.exists(os.path.join(include, "Python.h")):
            raise SystemExit("idem: Python.h not found in %s (Debian: apt-get "
                             "install python3-dev; elsewhere the package that has "
                             "Python's headers)" % include)
        # Stripped (-s): no symbol table or debug information shipped,
        # unless IDEM_PY_NOSTRIP=1 (for a debugger).
        strip = [] if os.environ.get("IDEM_PY_NOSTRIP") == "1" else ["-s"]
        cmd = [*cc, "-shared", "-fPIC", "-O2", "-fvisibility=hidden", *strip,
               "-I" + include, "-I" + HERE, *cflags, c_file, "-o", out + ".tmp", *libs]
        subprocess.run(cmd, check=True)
        os.replace(out + ".tmp", out)
        # idem._speedups: Python's own API only; it calls libidem through
        # the functions idem._native gives it (see idem_speedups.c).
        fast = os.path.join(dest_pkg, "_speedups" + ext)
        cmd = [*cc, "-shared", "-fPIC", "-O2", "-fvisibility=hidden", *strip,
               "-I" + include, "-I" + HERE, os.path.join(HERE, "idem_speedups.c"), "-o",
               fast + ".tmp"]
        subprocess.run(cmd, check=True)
        os.replace(fast + ".tmp", fast)
    return out


def _copy_sources(dest_pkg):
    src = os.path.join(PKG_ROOT, NAME)
    os.makedirs(dest_pkg, exist_ok=True)
    for f in sorted(os.listdir(src)):
        if f.endswith(".py") or f in ("py.typed",) or f.endswith(".pyi"):
            shutil.copy2(os.path.join(src, f), os.path.join(dest_pkg, f))


def _tag():
    impl = "cp%d%d" % sys.version_info[:2]
    soabi = sysconfig.get_config_var("SOABI") or ""
    abi = impl + (sys.abiflags if soabi.startswith("cpython") else "")
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return "%s-%s-%s" % (impl, abi, plat)


def _metadata():
    version, summary, requires_python, requires = _project()
    lines = ["Metadata-Version: 2.1", "Name: " + NAME, "Version: " + version,
             "Summary: " + summary]
    licence, classifiers = _licence()
    if licence:
        lines.append("License: " + licence)
    lines += ["Classifier: " + c for c in classifiers]
    if _licence_file():
        lines.append("License-File: LICENSE")
    if requires_python:
        lines.append("Requires-Python: " + requires_python)
    lines += ["Requires-Dist: " + r for r in requires]
    readme = os.path.join(PKG_ROOT, "README.md")
    body = ""
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        body = "\n" + open(readme, encoding="utf-8").read()
    return "\n".join(lines) + "\n" + body


def _dist_info(version):
    return "%s-%s.dist-info" % (NAME, version)


# ---------------------------------------------------------------- PEP 517

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    version = _project()[0]
    info = os.path.join(metadata_directory, _dist_info(version))
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata())
    return os.path.basename(info)


def _write_wheel(wheel_directory, root, entries):
    """Zips root's entries (files, or folders of files) with the dist-info
    (METADATA, the LICENSE, WHEEL, RECORD) into a wheel; its name."""
    version = _project()[0]
    tag = _tag()
    wheel_name = "%s-%s-%s.whl" % (NAME, version, tag)
    info = os.path.join(root, _dist_info(version))
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata())
    if _licence_file():
        shutil.copy2(_licence_file(), os.path.join(info, "LICENSE"))
    with open(os.path.join(info, "WHEEL"), "w", encoding="utf-8") as f:
        f.write("Wheel-Version: 1.0\nGenerator: idem_backend\n"
                "Root-Is-Purelib: false\nTag: %s\n" % tag)
    files = []
    for entry in [*entries, info]:
        full = os.path.join(root, entry) if not os.path.isabs(entry) else entry
        if os.path.isdir(full):
            files += [os.path.join(full, f) for f in sorted(os.listdir(full))]
        else:
            files.append(full)
    records = []
    path = os.path.join(wheel_directory, wheel_name)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for full in files:
            arc = os.path.relpath(full, root)
            data = open(full, "rb").read()
            digest = base64.urlsafe_b64encode(
                hashlib.sha256(data).digest()).rstrip(b"=").decode()
            records.append("%s,sha256=%s,%d" % (arc, digest, len(data)))
            zf.write(full, arc)
        record = _dist_info(version) + "/RECORD"
        records.append(record + ",,")
        zf.writestr(record, "\n".join(records) + "\n")
    return wheel_name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    with tempfile.TemporaryDirectory(prefix="idem-wheel-") as root:
        pkg = os.path.join(root, NAME)
        _copy_sources(pkg)
        _compile(pkg)
        return _write_wheel(wheel_directory, root, [NAME])


# ------------------------------------------------- PEP 660 (pip install -e)

def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """pip install -e: the extensions compiled into the source folder
    (bindings/python/idem, beside its .py files) and a .pth file that puts
    bindings/python on sys.path, so that an edit of a .py file is seen at
    the next import. A change to the C sources, or a libidem rebuilt,
    needs `pip install -e` again."""
    _compile(os.path.join(PKG_ROOT, NAME))
    with tempfile.TemporaryDirectory(prefix="idem-editable-") as root:
        pth = os.path.join(root, "__editable__.%s-%s.pth" % (NAME, _project()[0]))
        with open(pth, "w", encoding="utf-8") as f:
            f.write(PKG_ROOT + "\n")
        return _write_wheel(wheel_directory, root, [os.path.basename(pth)])


def build_sdist(sdist_directory, config_settings=None):
    import tarfile
    version = _project()[0]
    base = "%s-%s" % (NAME, version)
    path = os.path.join(sdist_directory, base + ".tar.gz")
    with tarfile.open(path, "w:gz") as tf:
        def source_only(t):
            # No byte code, and no extension an editable install compiled
            # into the source folder.
            name = os.path.basename(t.name)
            if "__pycache__" in t.name or name.endswith((".so", ".tmp", ".pyc")):
                return None
            return t
        for entry in ("pyproject.toml", "README.md", "_backend", NAME):
            full = os.path.join(PKG_ROOT, entry)
            if os.path.exists(full):
                tf.add(full, arcname=base + "/" + entry, filter=source_only)
        # libidem's header, which the extension is compiled against (the
        # library itself is IDEM_BUILD_DIR's libidem.a or an installed one).
        headers = _header_dir()
        if headers is None:
            raise SystemExit("idem: include/idem.h not found: build the sdist from "
                             "the idem tree, or from an sdist")
        tf.add(os.path.join(headers, "idem.h"), arcname=base + "/include/idem.h")
        if _licence_file():
            tf.add(_licence_file(), arcname=base + "/LICENSE")
        info = tarfile.TarInfo(base + "/PKG-INFO")
        data = _metadata().encode()
        info.size = len(data)
        import io
        tf.addfile(info, io.BytesIO(data))
    return os.path.basename(path)


# ---------------------------------------------------------------- the tree

def main(argv):
    import argparse
    p = argparse.ArgumentParser(prog="idem_backend.py")
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("inplace", help="build the package into OUT/idem")
    q.add_argument("--build-dir", default=None,
                   help="the CMake build folder holding libidem.a")
    q.add_argument("--out", required=True)
    a = p.parse_args(argv)
    pkg = os.path.join(os.path.abspath(a.out), NAME)
    _copy_sources(pkg)
    print(_compile(pkg, a.build_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
