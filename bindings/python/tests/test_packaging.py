"""The package as pip builds it, offline (--no-build-isolation --no-index):
the metadata it declares, an sdist that builds, pip install -e, the
extensions stripped, the hint for a build dependency a venv lacks, and the
C sources against each Python's headers found here.

The builds link the libidem.a of IDEM_BUILD_DIR (binding.sh sets it to the
build folder under test); without it these tests are skipped.
"""
import email
import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import textwrap

import pytest

PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # bindings/python
BACKEND = os.path.join(PKG, "_backend")
BUILD_DIR = os.environ.get("IDEM_BUILD_DIR", "")


def backend(code, python=sys.executable, env=None, cwd=None):
    """Runs code with idem_backend imported (as pip runs a hook)."""
    script = "import sys; sys.path.insert(0, %r); import idem_backend\n" % BACKEND + code
    return subprocess.run([python, "-c", script], capture_output=True, text=True,
                          timeout=600, env=env, cwd=cwd)


def need_build_dir():
    if not BUILD_DIR or not os.path.exists(os.path.join(BUILD_DIR, "libidem.a")):
        pytest.skip("IDEM_BUILD_DIR does not name a build folder with libidem.a")


def venv(tmp_path, name, system=True):
    path = tmp_path / name
    args = [sys.executable, "-m", "venv", str(path)]
    if system:
        args.insert(3, "--system-site-packages")
    else:
        args.insert(3, "--without-pip")
    subprocess.run(args, check=True, capture_output=True, timeout=300)
    return str(path / "bin" / "python")


def pip_install(python, *args):
    env = dict(os.environ, IDEM_BUILD_DIR=BUILD_DIR)
    env.pop("PYTHONPATH", None)  # the venv's idem, not the one under test
    run = subprocess.run([python, "-m", "pip", "install", "-q", "--no-index",
                          "--no-build-isolation", "--disable-pip-version-check", *args],
                         capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    return env


SMOKE = textwrap.dedent('''
    import sys, idem
    with idem.open("sqlite:" + sys.argv[1]) as store:
        @store.idempotent("op", key="k")
        def f(k):
            return [k]
        a, b = f.outcome("x"), f.outcome("x")
    print(idem.__file__, a.value, a.replayed, b.replayed)
''')


def smoke(python, env, db):
    run = subprocess.run([python, "-c", SMOKE, str(db)], capture_output=True, text=True,
                         timeout=120, env=env, cwd=os.path.dirname(str(db)))
    assert run.returncode == 0, run.stderr
    where, value, first, again = run.stdout.split()
    assert (value, first, again) == ("['x']", "False", "True")
    return where


def test_metadata_says_what_is_true(tmp_path):
    run = backend("print(idem_backend.prepare_metadata_for_build_wheel(%r))" % str(tmp_path))
    assert run.returncode == 0, run.stderr
    meta = email.message_from_string(
        (tmp_path / run.stdout.strip() / "METADATA").read_text(encoding="utf-8"))
    assert meta["Requires-Python"] == ">=3.10"  # Py_NewRef, PyModule_AddObjectRef, ParamSpec
    assert meta["License"] == "MIT"
    assert meta["License-File"] == "LICENSE"
    classifiers = meta.get_all("Classifier")
    assert "License :: OSI Approved :: MIT License" in classifiers
    for minor in (10, 11, 12, 13):
        assert "Programming Language :: Python :: 3.%d" % minor in classifiers
    assert "Programming Language :: Python :: 3.9" not in classifiers
    assert "Typing :: Typed" in classifiers
    assert sys.version_info >= (3, 10)


def test_the_c_sources_compile_against_each_python_found(tmp_path):
    """Both extensions' C (idem_speedups.c, and idem._native as cffi writes
    it) against the headers of every Python 3.10 or later here (Debian's,
    and others where installed), and the .py files by each such
    interpreter: no call or syntax that a 3.10 lacks."""
    sys.path.insert(0, BACKEND)
    try:
        import cffi
        import idem_backend
        import idem_cdef
    finally:
        sys.path.remove(BACKEND)
    has_pg = idem_backend._pkg_config("--exists", "libpq") is not None
    ffi = cffi.FFI()
    ffi.cdef(idem_cdef.cdef(has_pg))
    ffi.set_source("idem._native", idem_cdef.source(has_pg))
    native = str(tmp_path / "_native.c")
    ffi.emit_c_code(native)
    tree_include = os.path.join(os.path.dirname(os.path.dirname(PKG)), "include")
    deps = ["sqlite3"] + (["libpq"] if has_pg else [])
    native_flags = ["-I" + tree_include] + (idem_backend._pkg_config("--cflags", *deps) or [])
    sources = [(os.path.join(BACKEND, "idem_speedups.c"), []), (native, native_flags)]
    pys = glob.glob(os.path.join(PKG, "idem", "*.py")) + glob.glob(os.path.join(BACKEND, "*.py"))
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    includes = {sysconfig.get_paths()["include"]}
    for pattern in ("/usr/include/python3.*", "/usr/local/include/python3.*",
                    os.path.expanduser("~/.pyenv/versions/3.*/include/python3.*")):
        includes.update(glob.glob(pattern))
    tried = []
    for inc in sorted(includes):
        base = os.path.basename(inc.rstrip("/"))
        if not os.path.exists(os.path.join(inc, "Python.h")) or \
                not base.startswith("python3.") or base.endswith("d"):
            continue
        minor = int(base.split(".")[1].rstrip("mu"))
        if minor < 10:
            continue
        for src, flags in sources:
            run = subprocess.run([*cc, "-fsyntax-only", "-Werror=implicit-function-declaration",
                                  "-Werror=incompatible-pointer-types", "-I" + inc,
                                  "-I" + BACKEND, *flags, src],
                                 capture_output=True, text=True, timeout=300)
            assert run.returncode == 0, "%s, %s: %s" % (inc, src, run.stderr)
        # That version's interpreter, where it is beside its headers.
        prefix = os.path.dirname(os.path.dirname(inc.rstrip("/")))
        py = os.path.join(prefix, "bin", base)
        if os.path.exists(py):
            run = subprocess.run([py, "-c", "import py_compile, sys\nfor f in sys.argv[1:]: "
                                  "py_compile.compile(f, cfile=%r, doraise=True)"
                                  % str(tmp_path / "x.pyc"), *pys],
                                 capture_output=True, text=True, timeout=300)
            assert run.returncode == 0, "%s: %s" % (py, run.stderr)
        tried.append(minor)
    assert tried, "no Python headers found"


def sections(path):
    """The names of an ELF file's sections."""
    import struct
    data = open(path, "rb").read()
    assert data[:4] == b"\x7fELF" and data[4] == 2  # 64-bit
    end = "<" if data[5] == 1 else ">"
    shoff, = struct.unpack_from(end + "Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", data, 0x3A)
    heads = [struct.unpack_from(end + "IIQQQQ", data, shoff + i * shentsize)
             for i in range(shnum)]
    strtab = heads[shstrndx]
    names = data[strtab[4]:strtab[4] + strtab[5]]
    return [names[h[0]:names.index(b"\0", h[0])].decode() for h in heads]


def test_the_extensions_are_stripped():
    from idem import _native, _speedups
    for mod in (_native, _speedups):
        names = sections(mod.__file__)
        assert ".dynsym" in names
        assert ".symtab" not in names and not any(n.startswith(".debug") for n in names), \
            "%s is not stripped: %s" % (mod.__file__, names)


def test_the_sdist_builds_and_installs(tmp_path):
    need_build_dir()
    dist = tmp_path / "dist"
    dist.mkdir()
    run = backend("print(idem_backend.build_sdist(%r))" % str(dist))
    assert run.returncode == 0, run.stderr
    sdist = dist / run.stdout.strip()
    with tarfile.open(str(sdist)) as tf:
        names = tf.getnames()
    base = names[0].split("/")[0]
    for f in ("pyproject.toml", "PKG-INFO", "LICENSE", "include/idem.h",
              "_backend/idem_backend.py", "idem/__init__.py", "idem/py.typed",
              "idem/_native.pyi"):
        assert "%s/%s" % (base, f) in names, f
    assert not [n for n in names if n.endswith((".so", ".pyc"))]
    # Installed from the sdist alone, away from the tree.
    py = venv(tmp_path, "sdist-venv")
    env = pip_install(py, str(sdist))
    where = smoke(py, env, tmp_path / "sdist.db")
    assert where.startswith(str(tmp_path / "sdist-venv"))
    run = subprocess.run([py, "-c", "import importlib.metadata as m; "
                          "print(m.distribution('idem').read_text('LICENSE')[:20])"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert "MIT" in run.stdout


def test_pip_install_editable(tmp_path):
    """pip install -e (PEP 660): the source folder is imported, an edit of
    its .py files is seen. Made from a copy laid out as an sdist (include/
    beside the package), so that the tree's folder is not written."""
    need_build_dir()
    src = tmp_path / "src"
    shutil.copytree(PKG, str(src), ignore=shutil.ignore_patterns(
        "__pycache__", "*.so", "tests", "build", "dist", "*.egg-info"))
    tree = os.path.dirname(os.path.dirname(PKG))
    (src / "include").mkdir()
    shutil.copy2(os.path.join(tree, "include", "idem.h"), str(src / "include"))
    shutil.copy2(os.path.join(tree, "LICENSE"), str(src / "LICENSE"))
    py = venv(tmp_path, "edit-venv")
    env = pip_install(py, "-e", str(src))
    where = smoke(py, env, tmp_path / "edit.db")
    assert where == str(src / "idem" / "__init__.py")
    with open(str(src / "idem" / "__init__.py"), "a", encoding="utf-8") as f:
        f.write("\nEDITED = True\n")
    run = subprocess.run([py, "-c", "import idem; print(idem.EDITED)"], capture_output=True,
                         text=True, env=env, timeout=60, cwd=str(tmp_path))
    assert run.stdout.strip() == "True", run.stderr


def test_a_bare_venv_is_told_how_to_get_cffi(tmp_path):
    """A venv that does not see the system's packages: Debian's
    python3-cffi is no help there, so the hint says pip install cffi or
    --system-site-packages."""
    py = venv(tmp_path, "bare", system=False)
    run = subprocess.run([py, "-c", "import cffi"], capture_output=True, timeout=60)
    if run.returncode == 0:
        pytest.skip("this Python's venv sees a cffi of its own")
    run = backend("idem_backend._import_cffi()", python=py)
    assert run.returncode != 0
    assert "pip install cffi" in run.stderr, run.stderr
    assert "--system-site-packages" in run.stderr, run.stderr
    assert "venv" in run.stderr


def test_a_missing_cffi_at_import_says_how_to_get_it():
    code = ("import sys; sys.modules['_cffi_backend'] = None\n"
            "try:\n    import idem\nexcept ImportError as e:\n    print(e)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert "pip install cffi" in run.stdout and "--system-site-packages" in run.stdout, \
        run.stdout + run.stderr
