/*
 * idem._speedups -- the decorator's call, execute_local()'s, and
 * tx.execute(), in one crossing from Python each.
 *
 * A replay answered from libidem's cache takes about 1.5 us in C; through
 * cffi, Python spent as much again writing the arguments as JSON, reading
 * the claim's fields one by one and decoding the stored result, and a
 * fresh call more: the function called back through cffi, its result
 * written, the key ended through more crossings. This module does those
 * steps in C: it writes the request (a dict of the call's arguments, or
 * any JSON-like value) as JSON, calls libidem through the functions
 * idem._native exports for it (idem_py_begin_held, idem_py_finish,
 * idem_py_local_fresh; their addresses are given to once_setup() and
 * local_setup()), with the GIL released, runs the caller's function, and
 * builds the Outcome itself.
 *
 * It holds no libidem of its own (idem._native's is the one in use) and
 * knows no struct of it: the store, the options, the claim and the buffer
 * are addresses that idem._store keeps.
 *
 * once() and local() return:
 *   - an Outcome: a replay, or the call that ran, its stored result
 *     decoded as JSON;
 *   - an int, libidem's result code: the claim was made, this call does
 *     not hold the key, and Python reads it from the idem_py_claim, as
 *     after idem_py_begin() or idem_py_local_run() (a refusal, an error,
 *     or a replay this module leaves to Python: a body too large for the
 *     buffer, or one with white space about it);
 *   - NotImplemented: the request holds a value this encoder leaves to
 *     Python's json (another type, a subclass, an int past 64 bits, a float
 *     that is not finite, a non-str dict key, a str that is not valid
 *     UTF-8, nesting deeper than 64); nothing was called;
 * or raise what the caller's function raised, or the error of an ending
 * that failed after it ran (see each). local_call() and once_call(), the
 * same calls made whole from the Store (its call counted, a spare claim
 * taken), answer alike, but an int comes as (int, the spare pair) for
 * Python to read and then give back (Store._done()).
 *
 * Any text the encoder writes is valid JSON for the value, which is all
 * libidem needs: the fingerprint is taken on its canonical form (RFC 8785),
 * so it is the one Python's json would give.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "idem_py_sqlite.h"

typedef int (*callback_fn)(void *conn, void *ctx, void *response);
typedef int64_t (*local_fn)(void *store, const char *tenant,
                            const char *operation, const char *key,
                            const char *request, size_t request_len,
                            const void *opts, callback_fn fn, void *ctx,
                            void *claim, char *buf, size_t cap, int64_t *left);
typedef void (*respond_fn)(void *response, const char *body, size_t len);

static local_fn fresh_call; /* idem_py_local_fresh */
static respond_fn respond;
static int64_t fresh_mark; /* IDEM_PY_FRESH; IDEM_PY_AGAIN is fresh_mark - 2 */
static long rejected;      /* IDEM_EREJECTED */
static PyObject *dump_body; /* idem._store._local_body: the result as JSON */
typedef int64_t (*held_fn)(void *store, const char *tenant,
                           const char *operation, const char *key,
                           const char *request, size_t request_len,
                           const void *opts, void *claim, char *buf,
                           size_t cap, int64_t *left);
typedef int (*finish_fn)(void *claim, int result, const char *body,
                         size_t len);
static held_fn held_call;
static finish_fn finish_call;
static int end_done, end_not_done, end_unknown; /* idem_exec_result */
static PyObject *not_done_cls; /* idem.NotDone */
static PyObject *end_failed;   /* idem._store._end_failed: (rc, value) -> error */
static PyObject *result_body;  /* idem._store._result_body */
static PyObject *outcome_cls; /* idem.Outcome */
static PyObject *scan;        /* json's scanner: (text, 0) -> (value, end) */
static PyObject *zero;

enum { MAX_DEPTH = 64, STACK_BYTES = 2048 };

typedef struct {
  char *p;
  size_t len, cap;
  char stack[STACK_BYTES];
} text;

static void text_init(text *t) {
  t->p = t->stack;
  t->len = 0;
  t->cap = sizeof t->stack;
}

static void text_free(text *t) {
  if (t->p != t->stack)
    PyMem_Free(t->p);
}

/* Room for n more bytes; 0 on success, -1 with MemoryError set. */
static int reserve(text *t, size_t n) {
  char *q;
  size_t cap;
  if (t->cap - t->len >= n)
    return 0;
  cap = t->cap * 2 > t->len + n ? t->cap * 2 : t->len + n;
  q = t->p == t->stack ? PyMem_Malloc(cap) : PyMem_Realloc(t->p, cap);
  if (!q) {
    PyErr_NoMemory();
    return -1;
  }
  if (t->p == t->stack)
    memcpy(q, t->stack, t->len);
  t->p = q;
  t->cap = cap;
  return 0;
}

static int put(text *t, const char *s, size_t n) {
  if (reserve(t, n) < 0)
    return -1;
  memcpy(t->p + t->len, s, n);
  t->len += n;
  return 0;
}

/* A str as a JSON string: 0, 1 (left to Python) or -1 (MemoryError). */
static int put_str(text *t, PyObject *o) {
  static const char hex[] = "0123456789abcdef";
  Py_ssize_t n;
  const char *s = PyUnicode_AsUTF8AndSize(o, &n);
  if (!s) { /* a lone surrogate: Python's encoder says what is wrong */
    if (PyErr_ExceptionMatches(PyExc_MemoryError))
      return -1;
    PyErr_Clear();
    return 1;
  }
  /* At worst every byte becomes \u00XX. */
  if (reserve(t, (size_t)n * 6 + 2) < 0)
    return -1;
  t->p[t->len++] = '"';
  for (Py_ssize_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') {
      t->p[t->len++] = '\\';
      t->p[t->len++] = (char)c;
    } else if (c < 0x20) {
      memcpy(t->p + t->len, "\\u00", 4);
      t->p[t->len + 4] = hex[c >> 4];
      t->p[t->len + 5] = hex[c & 15];
      t->len += 6;
    } else {
      t->p[t->len++] = (char)c;
    }
  }
  t->p[t->len++] = '"';
  return 0;
}

/* o as JSON: 0, 1 (left to Python) or -1 (MemoryError). */
static int put_value(text *t, PyObject *o, int depth) {
  if (o == Py_None)
    return put(t, "null", 4);
  if (o == Py_True)
    return put(t, "true", 4);
  if (o == Py_False)
    return put(t, "false", 5);
  if (PyUnicode_CheckExact(o))
    return put_str(t, o);
  if (PyLong_CheckExact(o)) {
    int overflow;
    char num[32];
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow)
      return 1;
    return put(t, num, (size_t)snprintf(num, sizeof num, "%lld", v));
  }
  if (PyFloat_CheckExact(o)) {
    double v = PyFloat_AS_DOUBLE(o);
    char *s;
    int rc;
    if (!isfinite(v))
      return 1;
    /* float.__repr__, as json writes it: the shortest text that reads back
     * as v. */
    s = PyOS_double_to_string(v, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (!s)
      return -1;
    rc = put(t, s, strlen(s));
    PyMem_Free(s);
    return rc;
  }
  if (depth >= MAX_DEPTH)
    return 1;
  if (PyDict_CheckExact(o)) {
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    int first = 1, rc;
    if (put(t, "{", 1) < 0)
      return -1;
    while (PyDict_Next(o, &pos, &k, &v)) {
      if (!PyUnicode_CheckExact(k))
        return 1; /* json writes 1 as "1": Python's rules */
      if ((!first && put(t, ",", 1) < 0))
        return -1;
      first = 0;
      if ((rc = put_str(t, k)) != 0 || (rc = put(t, ":", 1)) != 0 ||
          (rc = put_value(t, v, depth + 1)) != 0)
        return rc;
    }
    return put(t, "}", 1);
  }
  if (PyList_CheckExact(o) || PyTuple_CheckExact(o)) {
    int rc;
    if (put(t, "[", 1) < 0)
      return -1;
    /* A list's length is read each time: nothing here runs Python code,
     * but the check costs nothing. */
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(o); i++) {
      if (i && put(t, ",", 1) < 0)
        return -1;
      if ((rc = put_value(t, PySequence_Fast_GET_ITEM(o, i), depth + 1)) != 0)
        return rc;
    }
    return put(t, "]", 1);
  }
  return 1;
}

/* ------------------------------------------------ Outcome */

/*
 * What idem.Outcome is made of: its three fields, set in C. idem.Outcome
 * is a Python subclass of it (its docstring, repr and pickling); a call's
 * Outcome is made here without running Python code, as most of them are.
 */
typedef struct {
  PyObject_HEAD
  PyObject *value;
  PyObject *replayed;
  PyObject *recovered;
} outcome_obj;

static int outcome_traverse(outcome_obj *o, visitproc visit, void *arg) {
  Py_VISIT(o->value);
  Py_VISIT(o->replayed);
  Py_VISIT(o->recovered);
  return 0;
}

static int outcome_clear(outcome_obj *o) {
  Py_CLEAR(o->value);
  Py_CLEAR(o->replayed);
  Py_CLEAR(o->recovered);
  return 0;
}

static void outcome_dealloc(outcome_obj *o) {
  /* idem.Outcome's own dealloc lets go of its (heap) type after this. */
  PyObject_GC_UnTrack(o);
  outcome_clear(o);
  Py_TYPE(o)->tp_free((PyObject *)o);
}

static int outcome_init(outcome_obj *o, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"value", "replayed", "recovered", NULL};
  PyObject *value, *replayed, *recovered;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:Outcome", names, &value,
                                   &replayed, &recovered))
    return -1;
  Py_XSETREF(o->value, Py_NewRef(value));
  Py_XSETREF(o->replayed, Py_NewRef(replayed));
  Py_XSETREF(o->recovered, Py_NewRef(recovered));
  return 0;
}

static PyMemberDef outcome_members[] = {
    {"value", T_OBJECT_EX, offsetof(outcome_obj, value), 0,
     "the call's result, JSON-decoded"},
    {"replayed", T_OBJECT_EX, offsetof(outcome_obj, replayed), 0,
     "True when an earlier call's stored result answered this one"},
    {"recovered", T_OBJECT_EX, offsetof(outcome_obj, recovered), 0,
     "True when an earlier attempt may also have acted"},
    {NULL, 0, 0, 0, NULL}};

static PyTypeObject outcome_base = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "idem._speedups.OutcomeBase",
    .tp_basicsize = sizeof(outcome_obj),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The fields of idem.Outcome.",
    .tp_traverse = (traverseproc)outcome_traverse,
    .tp_clear = (inquiry)outcome_clear,
    .tp_dealloc = (destructor)outcome_dealloc,
    .tp_members = outcome_members,
    .tp_init = (initproc)outcome_init,
    .tp_new = PyType_GenericNew,
};

/* An idem.Outcome of value (a new reference, stolen, also on failure). */
static PyObject *outcome_new(PyObject *value, int replayed, int recovered) {
  PyTypeObject *type = (PyTypeObject *)outcome_cls;
  outcome_obj *o = (outcome_obj *)type->tp_alloc(type, 0);
  if (!o) {
    Py_DECREF(value);
    return NULL;
  }
  o->value = value;
  o->replayed = Py_NewRef(replayed ? Py_True : Py_False);
  o->recovered = Py_NewRef(recovered ? Py_True : Py_False);
  return (PyObject *)o;
}

/* The Outcome of a call (replayed or not) whose stored body (len bytes) is
 * in buf; NULL with no exception set when Python is to read it instead. */
static PyObject *outcome_of(const char *buf, size_t len, int replay,
                            int recovered) {
  PyObject *s, *args[2], *got, *value, *out;
  s = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)len, NULL);
  if (!s)
    goto python;
  args[0] = s;
  args[1] = zero;
  got = PyObject_Vectorcall(scan, args, 2, NULL);
  if (!got) {
    Py_DECREF(s);
    goto python; /* white space about it, or not JSON */
  }
  if (!PyTuple_Check(got) || PyTuple_GET_SIZE(got) != 2 ||
      PyLong_AsSsize_t(PyTuple_GET_ITEM(got, 1)) != PyUnicode_GET_LENGTH(s)) {
    Py_DECREF(got);
    Py_DECREF(s);
    goto python;
  }
  value = Py_NewRef(PyTuple_GET_ITEM(got, 0));
  out = outcome_new(value, replay, recovered);
  Py_DECREF(got);
  Py_DECREF(s);
  return out;
python:
  if (PyErr_ExceptionMatches(PyExc_MemoryError))
    return NULL;
  PyErr_Clear();
  return NULL;
}

static int address(PyObject *o, void **out) {
  *out = PyLong_AsVoidPtr(o);
  return *out || !PyErr_Occurred() ? 0 : -1;
}

static int bytes_arg(PyObject *o, const char **out, const char *what) {
  if (!PyBytes_CheckExact(o)) {
    PyErr_Format(PyExc_TypeError, "%s must be bytes", what);
    return -1;
  }
  *out = PyBytes_AS_STRING(o);
  return 0;
}

/* ------------------------------------------------ execute_local() */

/*
 * The function of an execute_local() call, as libidem runs it inside the
 * store's transaction (on the calling thread, or on the one committing the
 * batch): what idem._store's idem_py_local() does through cffi, without
 * the crossing. It makes the Transaction, marks the store as running a
 * function on this thread (a call back into it would wait for the
 * transaction it runs in), calls fn(tx), ends tx, and writes the result as
 * JSON (this module's encoder, or idem._store._local_body() for what it
 * leaves to Python). What fn raised, or the result's encoding, is kept for
 * the caller and the transaction rolls back.
 *
 * All of it runs in a copy of the caller's context (contextvars), taken
 * at the call: the thread committing a batch runs other callers' functions
 * too, and each must see its own caller's context variables (a request's
 * user, Flask's g), not that thread's. A copy, as asyncio.to_thread()
 * makes, so that what fn sets is seen neither by the thread that ran it
 * nor by its caller, whichever thread it ran on.
 */
typedef struct {
  PyObject *fn;      /* the caller's function */
  PyObject *store;   /* the idem.Store */
  PyObject *tx_new;  /* (Transaction, backend, statements) */
  PyObject *context; /* a copy of the caller's context, fn's to run in */
  PyObject *error;   /* what fn (or the encoding) raised, with its traceback */
  PyObject *dumped;  /* the result as JSON bytes, when Python wrote it */
  text body;         /* the result as JSON, when this module wrote it */
} local_ctx;

/* The Store whose function runs on this thread, or NULL (borrowed: the
 * call that runs it holds it). */
static _Thread_local PyObject *local_store;
static PyObject *str_open; /* "_open" */

static void local_clear(local_ctx *c) {
  Py_CLEAR(c->error);
  Py_CLEAR(c->dumped);
  text_free(&c->body);
  text_init(&c->body);
}

/* The exception set now, taken (an instance, with its traceback). */
static PyObject *take_error(void) {
#if PY_VERSION_HEX >= 0x030C0000
  return PyErr_GetRaisedException();
#else
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb && value)
    PyException_SetTraceback(value, tb);
  Py_XDECREF(type);
  Py_XDECREF(tb);
  return value;
#endif
}

/* Sets e (taken by take_error(), or NULL: none) as the exception; steals
 * it. */
static void give_error(PyObject *e) {
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(e);
#else
  if (e)
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(e)), e,
                  PyException_GetTraceback(e));
#endif
}

static int local_run(void *conn, void *ctx, void *response) {
  local_ctx *c = ctx;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject *outer = local_store, *addr, *tx = NULL, *value = NULL, *args[4];
  int rc = -1, entered;
  local_clear(c); /* libidem runs it once; a second run would start anew */
  local_store = c->store;
  entered = PyContext_Enter(c->context) == 0;
  addr = entered ? PyLong_FromVoidPtr(conn) : NULL;
  if (addr) {
    args[1] = PyTuple_GET_ITEM(c->tx_new, 1);
    args[2] = addr;
    args[3] = PyTuple_GET_ITEM(c->tx_new, 2);
    tx = PyObject_Vectorcall(PyTuple_GET_ITEM(c->tx_new, 0), args + 1,
                             3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(addr);
  }
  if (tx) {
    PyObject *raised;
    value = PyObject_CallOneArg(c->fn, tx);
    /* tx ends with the function, whatever it did. */
    raised = value ? NULL : take_error();
    if (PyObject_SetAttr(tx, str_open, Py_False) < 0) {
      Py_XDECREF(raised);
      Py_CLEAR(value);
    } else if (raised) {
      give_error(raised);
    }
    Py_DECREF(tx);
  }
  if (value) {
    int put_rc = put_value(&c->body, value, 0);
    if (put_rc == 0) {
      respond(response, c->body.p, c->body.len);
      rc = 0;
    } else if (put_rc > 0) {
      c->dumped = PyObject_CallOneArg(dump_body, value);
      if (c->dumped && !PyBytes_Check(c->dumped)) {
        PyErr_SetString(PyExc_TypeError, "_local_body() must return bytes");
        Py_CLEAR(c->dumped);
      }
      if (c->dumped) {
        respond(response, PyBytes_AS_STRING(c->dumped),
                (size_t)PyBytes_GET_SIZE(c->dumped));
        rc = 0;
      }
    }
    Py_DECREF(value);
  }
  if (rc != 0) {
    c->error = take_error();
    rc = 1;
  }
  if (entered && PyContext_Exit(c->context) < 0)
    PyErr_WriteUnraisable(c->context); /* not entered by another: cannot be */
  local_store = outer;
  PyGILState_Release(gil);
  return rc;
}

/* The arguments local() and once() begin with: (store, tenant,
 * operation, key, request, opts); -1 with an exception set. */
static int call_args(PyObject *const *args, void **store, const char **tenant,
                     const char **operation, const char **key, void **opts) {
  return address(args[0], store) < 0 ||
                 bytes_arg(args[1], tenant, "tenant") < 0 ||
                 bytes_arg(args[2], operation, "operation") < 0 ||
                 bytes_arg(args[3], key, "key") < 0 || address(args[5], opts) < 0
             ? -1
             : 0;
}

/* A claim's (claim, buf, cap) arguments; -1 with an exception set. */
static int claim_args(PyObject *const *args, void **claim, void **bufp,
                      size_t *cap) {
  if (address(args[0], claim) < 0 || address(args[1], bufp) < 0)
    return -1;
  *cap = PyLong_AsSize_t(args[2]);
  return *cap == (size_t)-1 && PyErr_Occurred() ? -1 : 0;
}

/*
 * execute_local() with fn run by local_run(), through
 * idem_py_local_fresh(); owner is the idem.Store, tx_new (Transaction,
 * backend, statements). The Outcome of a replay or of fn's committed run
 * (its result decoded from the JSON stored); NULL with what fn raised (all
 * rolled back); an int as once() gives (Python reads the claim); or
 * NotImplemented (nothing called).
 */
static PyObject *local_core(void *store, const char *tenant,
                            const char *operation, const char *key,
                            PyObject *request, void *opts, PyObject *fn,
                            PyObject *owner, PyObject *tx_new, void *claim,
                            void *bufp, size_t cap) {
  text t;
  int rc;
  int64_t got, left = -1;
  PyObject *out = NULL;
  local_ctx c;
  text_init(&t);
  rc = put_value(&t, request, 0);
  if (rc != 0) {
    text_free(&t);
    if (rc < 0)
      return NULL;
    Py_RETURN_NOTIMPLEMENTED;
  }
  c.fn = fn;
  c.store = owner;
  c.tx_new = tx_new;
  c.context = PyContext_CopyCurrent();
  if (!c.context) {
    text_free(&t);
    return NULL;
  }
  c.error = c.dumped = NULL;
  text_init(&c.body);
  /* The claim's wait in slices: Ctrl-C is raised between them (nothing
   * held, nothing written), not when the whole wait ends. */
  for (;;) {
    Py_BEGIN_ALLOW_THREADS
    got = fresh_call(store, tenant, operation, key, t.p, t.len, opts,
                     local_run, &c, claim, bufp, cap, &left);
    Py_END_ALLOW_THREADS
    if (got != fresh_mark - 2)
      break;
    if (PyErr_CheckSignals() < 0) {
      text_free(&t);
      local_clear(&c);
      Py_DECREF(c.context);
      return NULL;
    }
  }
  text_free(&t);
  if (c.error && got == -1 - (int64_t)rejected) {
    /* fn raised: everything rolled back, the key released. */
    give_error(c.error);
    c.error = NULL; /* given */
  } else if (got == fresh_mark || got == fresh_mark - 1) {
    /* The result as stored, decoded: as a replay would give it. One too
     * large for buf left the claim's call to free: Python reads it. */
    int recovered = got != fresh_mark;
    const char *bp = c.dumped ? PyBytes_AS_STRING(c.dumped) : c.body.p;
    size_t blen = c.dumped ? (size_t)PyBytes_GET_SIZE(c.dumped) : c.body.len;
    out = blen <= cap ? outcome_of(bp, blen, 0, recovered) : NULL;
    if (!out && !PyErr_Occurred())
      out = PyLong_FromLong(0); /* Python reads it from the claim */
  } else if (got < 0) {
    out = PyLong_FromLongLong(-1 - got);
  } else {
    out = outcome_of(bufp, (size_t)(got >> 1), 1, (int)(got & 1));
    if (!out && !PyErr_Occurred())
      out = PyLong_FromLong(0);
  }
  local_clear(&c);
  Py_DECREF(c.context);
  return out;
}

static int local_ready(void) {
  if (fresh_call && respond && outcome_cls)
    return 1;
  PyErr_SetString(PyExc_RuntimeError, "idem._speedups: local_setup() not called");
  return 0;
}

/*
 * local(store, tenant, operation, key, request, opts, fn, owner, tx_new,
 * claim, buf, cap): local_core() with its arguments given one by one, for
 * execute_local() with options.
 */
static PyObject *sp_local(PyObject *self, PyObject *const *args,
                          Py_ssize_t nargs) {
  void *store, *opts, *claim, *bufp;
  const char *tenant, *operation, *key;
  size_t cap;
  (void)self;
  if (nargs != 12) {
    PyErr_SetString(PyExc_TypeError, "local() takes 12 arguments");
    return NULL;
  }
  if (!local_ready() ||
      call_args(args, &store, &tenant, &operation, &key, &opts) < 0 ||
      claim_args(args + 9, &claim, &bufp, &cap) < 0)
    return NULL;
  if (!PyTuple_CheckExact(args[8]) || PyTuple_GET_SIZE(args[8]) != 3) {
    PyErr_SetString(PyExc_TypeError,
                    "tx_new: (Transaction, backend, statements)");
    return NULL;
  }
  return local_core(store, tenant, operation, key, args[4], opts, args[6],
                    args[7], args[8], claim, bufp, cap);
}

/*
 * What local_call() reads of idem._store (see calls_setup()), and the
 * names it reads of a Store.
 */
static PyObject *names;     /* _NAMES: an operation or tenant -> its bytes */
static PyObject *spares;    /* _SPARES: (claim, buf, their addresses) */
static PyObject *new_pair;  /* _take(): a pair when there is no spare */
static void *plain_opts;    /* _PLAIN's idem_call_options */
static size_t spare_cap;    /* a pair's buffer's size */
static PyObject *str_fast, *str_store, *str_forked, *str_closing, *str_leave,
    *str_empty;

/* The bytes of an operation or tenant named before, or NULL (none set). */
static const char *name_of(PyObject *s) {
  PyObject *b = PyDict_GetItemWithError(names, s); /* kept there for good */
  if (!b || !PyBytes_Check(b)) {
    PyErr_Clear(); /* not there, or not hashable: Python's way says */
    return NULL;
  }
  return PyBytes_AS_STRING(b);
}

/* A spare pair, as _take(): list.pop() in C, with nothing run between. */
static PyObject *pair_take(void) {
  Py_ssize_t n = PyList_GET_SIZE(spares);
  PyObject *p;
  if (n == 0)
    return PyObject_CallNoArgs(new_pair);
  p = Py_NewRef(PyList_GET_ITEM(spares, n - 1));
  if (PyList_SetSlice(spares, n - 1, n, NULL) < 0)
    Py_CLEAR(p);
  return p;
}

/* The end of a local_call() (the call's token let go as Store._leave()
 * does, its pair kept as _give() does), whatever is raised meanwhile. */
static void call_done(PyObject *owner, PyObject *calls, PyObject *pair) {
  PyObject *raised = PyErr_Occurred() ? take_error() : NULL, *token, *closing;
  token = PyTuple_GET_ITEM(pair, 2);
  if (PySet_Discard(calls, token) < 0)
    PyErr_Clear();
  closing = PyObject_GetAttr(owner, str_closing);
  if (closing && PyObject_IsTrue(closing) > 0) /* close() waits for it */
    Py_XDECREF(PyObject_CallMethodOneArg(owner, str_leave, token));
  Py_XDECREF(closing);
  PyErr_Clear();
  if (PyList_GET_SIZE(spares) < 8 && PyList_Append(spares, pair) < 0)
    PyErr_Clear();
  if (raised)
    give_error(raised);
}

/*
 * A Store's call made whole in C (local_call(), once_call()), begun and
 * ended as Python's way does it: counted in the Store's _calls for close()
 * before the Store is asked whether it is open, a spare pair taken, and
 * both let go at the end, whatever was raised.
 */
typedef struct {
  PyObject *fast;  /* Store._fast: (address, calls, tx_new) */
  PyObject *calls; /* borrowed from fast */
  PyObject *pair;  /* (claim, buf, their addresses) */
  void *store, *claim, *bufp;
} store_call;

/* 1: begun; 0: not begun, nothing held, for Python's way to say why (a
 * Store closed, forked or called from its own function); -1: an error. */
static int call_begin(PyObject *owner, store_call *sc) {
  PyObject *fast, *pair, *handle, *forked;
  int refused;
  if (!names) {
    PyErr_SetString(PyExc_RuntimeError,
                    "idem._speedups: calls_setup() not called");
    return -1;
  }
  fast = PyObject_GetAttr(owner, str_fast);
  if (!fast)
    return -1;
  if (!PyTuple_CheckExact(fast) || PyTuple_GET_SIZE(fast) != 3 ||
      !PySet_Check(PyTuple_GET_ITEM(fast, 1)) ||
      !PyTuple_CheckExact(PyTuple_GET_ITEM(fast, 2)) ||
      PyTuple_GET_SIZE(PyTuple_GET_ITEM(fast, 2)) != 3) {
    Py_DECREF(fast);
    PyErr_SetString(PyExc_TypeError, "Store._fast: (address, calls, tx_new)");
    return -1;
  }
  if (address(PyTuple_GET_ITEM(fast, 0), &sc->store) < 0 ||
      !(pair = pair_take())) {
    Py_DECREF(fast);
    return -1;
  }
  if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 4 ||
      address(PyTuple_GET_ITEM(pair, 2), &sc->claim) < 0 ||
      address(PyTuple_GET_ITEM(pair, 3), &sc->bufp) < 0) {
    if (!PyErr_Occurred())
      PyErr_SetString(PyExc_TypeError, "a pair: (claim, buf, addresses)");
    Py_DECREF(pair);
    Py_DECREF(fast);
    return -1;
  }
  sc->fast = fast;
  sc->calls = PyTuple_GET_ITEM(fast, 1);
  sc->pair = pair;
  /* Counted before the Store is asked whether it is open: close() then
   * either refuses this call or waits for it. */
  if (PySet_Add(sc->calls, PyTuple_GET_ITEM(pair, 2)) < 0) {
    Py_DECREF(pair);
    Py_DECREF(fast);
    return -1;
  }
  handle = PyObject_GetAttr(owner, str_store);
  forked = handle ? PyObject_GetAttr(owner, str_forked) : NULL;
  refused = !forked || handle == Py_None || PyObject_IsTrue(forked) != 0 ||
            local_store == owner;
  Py_XDECREF(handle);
  Py_XDECREF(forked);
  if (!refused)
    return 1;
  PyErr_Clear(); /* Store._handle() says why */
  call_done(owner, sc->calls, pair);
  Py_DECREF(pair);
  Py_DECREF(fast);
  return 0;
}

/* Ends what call_begin() began with the call's answer out (NULL: raised);
 * an int answer (a claim not held) becomes (rc, pair), the call still
 * counted and the pair still taken, for Python to read the claim and then
 * let both go (Store._done()). */
static PyObject *call_end(PyObject *owner, store_call *sc, PyObject *out) {
  if (out && PyLong_CheckExact(out)) {
    PyObject *both = PyTuple_Pack(2, out, sc->pair);
    Py_DECREF(out);
    if (both) {
      Py_DECREF(sc->pair);
      Py_DECREF(sc->fast);
      return both;
    }
    out = NULL;
  }
  call_done(owner, sc->calls, sc->pair);
  Py_DECREF(sc->pair);
  Py_DECREF(sc->fast);
  return out;
}

/* The UTF-8 of a key given as a str without NUL, or NULL (none set): for
 * Python's way to check. */
static const char *key_of(PyObject *k) {
  Py_ssize_t n;
  const char *key = PyUnicode_CheckExact(k) ? PyUnicode_AsUTF8AndSize(k, &n)
                                            : NULL;
  if (!key || strlen(key) != (size_t)n) {
    PyErr_Clear();
    return NULL;
  }
  return key;
}

/*
 * local_call(owner, operation, key, request, fn, tenant): a Store's
 * execute_local() with no options, whole, as execute_local() does it in
 * Python: the names looked up in _NAMES, the key's UTF-8, and local_core()
 * run between call_begin() and call_end(). It gives local_core()'s Outcome
 * or raises what fn raised; (rc, pair) for a claim not held (see
 * call_end()); NotImplemented, with nothing called or held, for all that
 * Python's way tells better: a name not seen before, a key that is not a
 * str or holds NUL, a request this module leaves to Python, a Store
 * closed, forked or called from its own function.
 */
static PyObject *sp_local_call(PyObject *self, PyObject *const *args,
                               Py_ssize_t nargs) {
  const char *operation, *tenant, *key;
  store_call sc;
  int begun;
  (void)self;
  if (nargs != 6) {
    PyErr_SetString(PyExc_TypeError, "local_call() takes 6 arguments");
    return NULL;
  }
  if (!local_ready() || !names) {
    if (!PyErr_Occurred())
      PyErr_SetString(PyExc_RuntimeError,
                      "idem._speedups: calls_setup() not called");
    return NULL;
  }
  operation = name_of(args[1]);
  tenant = name_of(args[5] == Py_None ? str_empty : args[5]);
  key = key_of(args[2]);
  if (!operation || !tenant || !key)
    Py_RETURN_NOTIMPLEMENTED;
  begun = call_begin(args[0], &sc);
  if (begun <= 0)
    return begun < 0 ? NULL : Py_NewRef(Py_NotImplemented);
  return call_end(args[0], &sc,
                  local_core(sc.store, tenant, operation, key, args[3],
                             plain_opts, args[4], args[0],
                             PyTuple_GET_ITEM(sc.fast, 2), sc.claim, sc.bufp,
                             spare_cap));
}

/* calls_setup(names, spares, take, plain, cap): what local_call() reads of
 * idem._store: _NAMES, _SPARES, _take, the address of _PLAIN's
 * idem_call_options and _BUF_SIZE. */
static PyObject *sp_calls_setup(PyObject *self, PyObject *args) {
  PyObject *n, *sp, *tk, *pl;
  Py_ssize_t cap;
  void *plain;
  (void)self;
  if (!PyArg_ParseTuple(args, "O!O!OOn", &PyDict_Type, &n, &PyList_Type, &sp,
                        &tk, &pl, &cap))
    return NULL;
  if (address(pl, &plain) < 0)
    return NULL;
  if (!plain || cap <= 0 || !PyCallable_Check(tk)) {
    PyErr_SetString(PyExc_ValueError,
                    "calls_setup(names, spares, take, plain, cap)");
    return NULL;
  }
#define INTERN(var, s)                                                         \
  if (!var && !(var = PyUnicode_InternFromString(s)))                          \
    return NULL;
  INTERN(str_fast, "_fast")
  INTERN(str_store, "_store")
  INTERN(str_forked, "_forked")
  INTERN(str_closing, "_closing")
  INTERN(str_leave, "_leave")
  INTERN(str_empty, "")
#undef INTERN
  Py_XSETREF(names, Py_NewRef(n));
  Py_XSETREF(spares, Py_NewRef(sp));
  Py_XSETREF(new_pair, Py_NewRef(tk));
  plain_opts = plain;
  spare_cap = (size_t)cap;
  Py_RETURN_NONE;
}

/*
 * The decorator's call in one crossing each way: once(store, tenant,
 * operation, key, request, opts, claim, buf, cap, fn, args, kwargs,
 * release_on). The request (the call's arguments but the key) written as
 * JSON, the key claimed (idem_py_begin_held()); when this call holds it,
 * fn(*args, **kwargs) runs here, its result is written as JSON (or by
 * idem._store._result_body() for what this module leaves to Python) and
 * decoded, and the key is ended by what happened (idem_py_finish()):
 *   - the result stored: its Outcome;
 *   - fn raised idem.NotDone or one of release_on: the key released, the
 *     exception raised; anything else it raised, or a result that cannot
 *     be stored: the key marked unknown, the exception raised;
 *   - the ending failed after fn ran: the error idem._store._end_failed()
 *     makes of it raised, with the decoded result kept as its .value.
 * A replay is its Outcome; a claim not held an int, for Python to read the
 * claim; NotImplemented for arguments left to Python's json (nothing
 * called). Nothing runs Python code
 * between the claim and fn, nor between fn's return and the ending but the
 * encoder Python is left (which ends the key too when it fails).
 */
static int is_release(PyObject *exc, PyObject *release_on) {
  int yes = PyObject_IsInstance(exc, not_done_cls);
  if (yes == 0 && PyTuple_GET_SIZE(release_on) > 0)
    yes = PyObject_IsInstance(exc, release_on);
  if (yes < 0) { /* cannot tell: not released, the safe side */
    PyErr_Clear();
    yes = 0;
  }
  return yes;
}

static int finish(void *claim, int result, const char *body, size_t len) {
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = finish_call(claim, result, body, len);
  Py_END_ALLOW_THREADS
  return rc;
}

/* Ends the key as unknown (or released) and raises what was raised. */
static PyObject *end_raising(void *claim, PyObject *release_on) {
  PyObject *exc = take_error();
  int release = exc && is_release(exc, release_on);
  finish(claim, release ? end_not_done : end_unknown, NULL, 0);
  give_error(exc);
  return NULL;
}

/* The decorator's call, its arguments read (fkwargs NULL: none). */
static PyObject *once_core(void *store, const char *tenant,
                           const char *operation, const char *key,
                           PyObject *request, void *opts, void *claim,
                           void *bufp, size_t cap, PyObject *fn,
                           PyObject *fargs, PyObject *fkwargs,
                           PyObject *release_on) {
  const char *bp;
  size_t blen;
  text t, body;
  int rc, recovered;
  int64_t got, left = -1;
  PyObject *value, *dumped = NULL, *s, *scan_args[2], *scanned, *decoded,
      *out;
  text_init(&t);
  rc = put_value(&t, request, 0);
  if (rc != 0) {
    text_free(&t);
    if (rc < 0)
      return NULL;
    Py_RETURN_NOTIMPLEMENTED;
  }
  /* The claim's wait in slices: Ctrl-C is raised between them (nothing
   * held, nothing written), not when the whole wait ends. */
  for (;;) {
    Py_BEGIN_ALLOW_THREADS
    got = held_call(store, tenant, operation, key, t.p, t.len, opts, claim,
                    bufp, cap, &left);
    Py_END_ALLOW_THREADS
    if (got != fresh_mark - 2)
      break;
    if (PyErr_CheckSignals() < 0) {
      text_free(&t);
      return NULL;
    }
  }
  text_free(&t);
  if (got >= 0) {
    out = outcome_of(bufp, (size_t)(got >> 1), 1, (int)(got & 1));
    if (out || PyErr_Occurred())
      return out;
    return PyLong_FromLong(0);
  }
  if (got != fresh_mark && got != fresh_mark - 1)
    return PyLong_FromLongLong(-1 - got);
  /* This call holds the key: fn runs, unless a signal came meanwhile
   * (Ctrl-C while the claim waited): nothing ran, the key is let go. */
  recovered = got != fresh_mark;
  if (PyErr_CheckSignals() < 0) {
    PyObject *exc = take_error();
    finish(claim, end_not_done, NULL, 0);
    give_error(exc);
    return NULL;
  }
  value = PyObject_Call(fn, fargs, fkwargs);
  if (!value)
    return end_raising(claim, release_on);
  text_init(&body);
  rc = put_value(&body, value, 0);
  if (rc > 0) {
    dumped = PyObject_CallOneArg(result_body, value);
    if (dumped && !PyBytes_Check(dumped)) {
      PyErr_SetString(PyExc_TypeError, "_result_body() must return bytes");
      Py_CLEAR(dumped);
    }
  }
  Py_DECREF(value);
  if (rc < 0 || (rc > 0 && !dumped)) {
    text_free(&body);
    /* It acted: a result that cannot be stored marks the key unknown,
     * whatever was raised. */
    {
      PyObject *exc = take_error();
      finish(claim, end_unknown, NULL, 0);
      give_error(exc);
    }
    return NULL;
  }
  bp = dumped ? PyBytes_AS_STRING(dumped) : body.p;
  blen = dumped ? (size_t)PyBytes_GET_SIZE(dumped) : body.len;
  /* The value as stored: what every replay of it will give. */
  decoded = NULL;
  s = PyUnicode_DecodeUTF8(bp, (Py_ssize_t)blen, NULL);
  if (s) {
    scan_args[0] = s;
    scan_args[1] = zero;
    scanned = PyObject_Vectorcall(scan, scan_args, 2, NULL);
    if (scanned && PyTuple_Check(scanned) && PyTuple_GET_SIZE(scanned) == 2) {
      decoded = Py_NewRef(PyTuple_GET_ITEM(scanned, 0));
    } else if (scanned) {
      PyErr_SetString(PyExc_ValueError, "json's scanner answered no pair");
    }
    Py_XDECREF(scanned);
    Py_DECREF(s);
  }
  if (!decoded) {
    PyObject *exc = take_error();
    finish(claim, end_unknown, NULL, 0);
    text_free(&body);
    Py_XDECREF(dumped);
    give_error(exc);
    return NULL;
  }
  rc = finish(claim, end_done, bp, blen);
  text_free(&body);
  Py_XDECREF(dumped);
  if (rc != 0) {
    /* It acted and its result is known: the error keeps it. */
    PyObject *err = PyObject_CallFunction(end_failed, "iO", rc, decoded);
    Py_DECREF(decoded);
    if (err) {
      PyErr_SetObject((PyObject *)Py_TYPE(err), err);
      Py_DECREF(err);
    }
    return NULL;
  }
  return outcome_new(decoded, 0, recovered);
}

static int once_ready(void) {
  if (held_call && finish_call && end_failed && outcome_cls)
    return 1;
  PyErr_SetString(PyExc_RuntimeError, "idem._speedups: once_setup() not called");
  return 0;
}

/* The arguments of fn's call and release_on, checked: 0, or -1 with an
 * exception set. */
static int fn_args(PyObject *fargs, PyObject *fkwargs, PyObject *release_on) {
  if (PyTuple_Check(fargs) && (!fkwargs || PyDict_Check(fkwargs)) &&
      PyTuple_Check(release_on))
    return 0;
  PyErr_SetString(PyExc_TypeError,
                  "once(): args a tuple, kwargs a dict, release_on a tuple");
  return -1;
}

/* once(store, tenant, operation, key, request, opts, claim, buf, cap, fn,
 * args, kwargs, release_on): once_core() with its arguments given one by
 * one, for a decorator whose key or tenant a function gives. */
static PyObject *sp_once(PyObject *self, PyObject *const *args,
                         Py_ssize_t nargs) {
  void *store, *opts, *claim, *bufp;
  const char *tenant, *operation, *key;
  size_t cap;
  PyObject *fkwargs;
  (void)self;
  if (nargs != 13) {
    PyErr_SetString(PyExc_TypeError, "once() takes 13 arguments");
    return NULL;
  }
  fkwargs = args[11] == Py_None ? NULL : args[11];
  if (!once_ready() ||
      call_args(args, &store, &tenant, &operation, &key, &opts) < 0 ||
      claim_args(args + 6, &claim, &bufp, &cap) < 0 ||
      fn_args(args[10], fkwargs, args[12]) < 0)
    return NULL;
  return once_core(store, tenant, operation, key, args[4], opts, claim, bufp,
                   cap, args[9], args[10], fkwargs, args[12]);
}

/*
 * once_call(owner, tenant, operation, key, arguments, opts, fn, args,
 * kwargs, release_on): a decorated call whose key is an argument, whole:
 * the key's UTF-8 (tenant and operation are the decorator's bytes) and
 * once_core() run between call_begin() and call_end(). Answers as
 * local_call() does: an Outcome, what fn raised (or an ending's error),
 * (rc, pair) for a claim not held, or NotImplemented with nothing called
 * or held (a key that is not a str or holds NUL, arguments left to
 * Python's json, a Store closed, forked or called from its own function).
 */
static PyObject *sp_once_call(PyObject *self, PyObject *const *args,
                              Py_ssize_t nargs) {
  const char *tenant, *operation, *key;
  void *opts;
  PyObject *fkwargs;
  store_call sc;
  int begun;
  (void)self;
  if (nargs != 10) {
    PyErr_SetString(PyExc_TypeError, "once_call() takes 10 arguments");
    return NULL;
  }
  fkwargs = args[8] == Py_None ? NULL : args[8];
  if (!once_ready() || bytes_arg(args[1], &tenant, "tenant") < 0 ||
      bytes_arg(args[2], &operation, "operation") < 0 ||
      address(args[5], &opts) < 0 || fn_args(args[7], fkwargs, args[9]) < 0)
    return NULL;
  if (!(key = key_of(args[3])))
    Py_RETURN_NOTIMPLEMENTED;
  begun = call_begin(args[0], &sc);
  if (begun <= 0)
    return begun < 0 ? NULL : Py_NewRef(Py_NotImplemented);
  return call_end(args[0], &sc,
                  once_core(sc.store, tenant, operation, key, args[4], opts,
                            sc.claim, sc.bufp, spare_cap, args[6], args[7],
                            fkwargs, args[9]));
}

static PyObject *sp_once_setup(PyObject *self, PyObject *args) {
  PyObject *h, *f, *nd, *rb, *ef;
  void *hp, *fp;
  int done, not_done, unknown;
  (void)self;
  if (!PyArg_ParseTuple(args, "OOiiiOOO", &h, &f, &done, &not_done, &unknown,
                        &nd, &rb, &ef))
    return NULL;
  if (address(h, &hp) < 0 || address(f, &fp) < 0)
    return NULL;
  if (!hp || !fp || !PyType_Check(nd) || !PyCallable_Check(rb) ||
      !PyCallable_Check(ef)) {
    PyErr_SetString(PyExc_ValueError,
                    "once_setup(held, finish, done, not_done, unknown, "
                    "NotDone, result_body, end_failed)");
    return NULL;
  }
  Py_XSETREF(not_done_cls, Py_NewRef(nd));
  Py_XSETREF(result_body, Py_NewRef(rb));
  Py_XSETREF(end_failed, Py_NewRef(ef));
  held_call = (held_fn)hp;
  finish_call = (finish_fn)fp;
  end_done = done;
  end_not_done = not_done;
  end_unknown = unknown;
  Py_RETURN_NONE;
}

/* local_store(): the Store whose function runs on this thread, or None. */
static PyObject *sp_local_store(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  return Py_NewRef(local_store ? local_store : Py_None);
}

/* swap_local(store or None): marks store as running a function on this
 * thread; the one marked before (or None), to give back after. */
static PyObject *sp_swap_local(PyObject *self, PyObject *store) {
  PyObject *outer = local_store ? local_store : Py_None;
  (void)self;
  local_store = store == Py_None ? NULL : store;
  return Py_NewRef(outer);
}

static PyObject *sp_setup(PyObject *self, PyObject *args) {
  PyObject *cls, *sc;
  (void)self;
  if (!PyArg_ParseTuple(args, "OO", &cls, &sc))
    return NULL;
  if (!PyType_Check(cls) ||
      !PyType_IsSubtype((PyTypeObject *)cls, &outcome_base) ||
      ((PyTypeObject *)cls)->tp_basicsize != outcome_base.tp_basicsize ||
      !PyCallable_Check(sc)) {
    PyErr_SetString(PyExc_ValueError,
                    "setup(Outcome, scan): Outcome a subclass of OutcomeBase "
                    "with __slots__ = ()");
    return NULL;
  }
  Py_INCREF(cls);
  Py_INCREF(sc);
  Py_XSETREF(outcome_cls, cls);
  Py_XSETREF(scan, sc);
  Py_RETURN_NONE;
}

static PyObject *sp_local_setup(PyObject *self, PyObject *args) {
  PyObject *l, *r, *dump;
  long long mark;
  long rej;
  void *lp, *rp;
  (void)self;
  if (!PyArg_ParseTuple(args, "OOLlO", &l, &r, &mark, &rej, &dump))
    return NULL;
  if (address(l, &lp) < 0 || address(r, &rp) < 0)
    return NULL;
  if (!lp || !rp || mark >= -1 || !PyCallable_Check(dump)) {
    PyErr_SetString(PyExc_ValueError,
                    "local_setup(local, respond, fresh, rejected, dump)");
    return NULL;
  }
  if (!str_open && !(str_open = PyUnicode_InternFromString("_open")))
    return NULL;
  Py_INCREF(dump);
  Py_XSETREF(dump_body, dump);
  fresh_call = (local_fn)lp;
  respond = (respond_fn)rp;
  fresh_mark = mark;
  rejected = rej;
  Py_RETURN_NONE;
}

/*
 * Whether tx.execute() in C takes every parameter itself: None, an int of
 * 64 bits, a float, a str of valid UTF-8 (its UTF-8 made now) or bytes,
 * each of exactly that type and shorter than 2 GiB; on PostgreSQL (pg) also
 * True and False, and no str holding NUL (libpq's text parameters end at
 * one). 0: leave the call to Python; -1: an error.
 */
static int simple_param(PyObject *v, int pg) {
  if (v == Py_None || PyFloat_CheckExact(v))
    return 1;
  if (v == Py_True || v == Py_False)
    return pg;
  if (PyBytes_CheckExact(v))
    return PyBytes_GET_SIZE(v) <= INT32_MAX;
  if (PyLong_CheckExact(v)) {
    int overflow;
    (void)PyLong_AsLongLongAndOverflow(v, &overflow);
    return !overflow;
  }
  if (PyUnicode_CheckExact(v)) {
    Py_ssize_t len;
    const char *p = PyUnicode_AsUTF8AndSize(v, &len);
    if (!p) {
      if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
        return -1;
      PyErr_Clear();
      return 0;
    }
    return len <= INT32_MAX && !(pg && memchr(p, '\0', (size_t)len));
  }
  return 0;
}

static int simple_params(PyObject *const *items, Py_ssize_t n, int pg) {
  for (Py_ssize_t i = 0; i < n; i++) {
    int rc = simple_param(items[i], pg);
    if (rc != 1)
      return rc;
  }
  return 1;
}

/* ---------------------------------------------- tx.execute() on SQLite */

/*
 * tx.execute(sql, params) on the store's SQLite connection, inside the
 * transaction of an execute_local() call: the statement kept from an
 * earlier run of the same text on this connection (or prepared now), its
 * parameters bound from the tuple, its rows read into tuples, and the
 * Cursor built, in one crossing. It does what idem._tx._sqlite_execute()
 * does, with statements kept the same way (in a dict of its own, which the
 * store's Statements holds and finalizes at close), and leaves to it
 * whatever it does not write itself.
 */
static const idem_py_sqlite_api *sq;
static PyObject *cursor_cls; /* idem._tx.Cursor */
static Py_ssize_t kept_limit;

enum { SQ_ROW = 100, SQ_DONE = 101 };
enum { SQ_INTEGER = 1, SQ_FLOAT, SQ_TEXT, SQ_BLOB };
#define SQ_TRANSIENT ((void (*)(void *))-1)

/* Whether the statement changes rows, as idem._tx._is_dml() says. */
static int is_dml(const char *sql, Py_ssize_t n) {
  static const char *const verbs[] = {"INSERT", "UPDATE", "DELETE", "REPLACE"};
  Py_ssize_t i = 0;
  while (i < n && (sql[i] == ' ' || (sql[i] >= '\t' && sql[i] <= '\r')))
    i++;
  for (size_t v = 0; v < sizeof verbs / sizeof verbs[0]; v++)
    if (n - i >= (Py_ssize_t)strlen(verbs[v]) &&
        PyOS_strnicmp(sql + i, verbs[v], strlen(verbs[v])) == 0)
      return 1;
  if (n - i < 4 || PyOS_strnicmp(sql + i, "WITH", 4) != 0)
    return 0;
  for (Py_ssize_t j = i; j < n; j++)
    for (size_t v = 0; v < sizeof verbs / sizeof verbs[0]; v++)
      if (n - j >= (Py_ssize_t)strlen(verbs[v]) &&
          PyOS_strnicmp(sql + j, verbs[v], strlen(verbs[v])) == 0)
        return 1;
  return 0;
}

static PyObject *sq_row(struct sqlite3_stmt *stmt, int columns) {
  PyObject *row = PyTuple_New(columns), *v;
  if (!row)
    return NULL;
  for (int c = 0; c < columns; c++) {
    int n;
    const void *p;
    switch (sq->column_type(stmt, c)) {
    case SQ_INTEGER:
      v = PyLong_FromLongLong(sq->column_int64(stmt, c));
      break;
    case SQ_FLOAT:
      v = PyFloat_FromDouble(sq->column_double(stmt, c));
      break;
    case SQ_TEXT:
      p = sq->column_text(stmt, c);
      n = sq->column_bytes(stmt, c);
      v = PyUnicode_DecodeUTF8(p ? p : "", n, "replace");
      break;
    case SQ_BLOB:
      p = sq->column_blob(stmt, c);
      n = sq->column_bytes(stmt, c);
      v = PyBytes_FromStringAndSize(n ? p : "", n);
      break;
    default:
      Py_INCREF(Py_None);
      v = Py_None;
    }
    if (!v) {
      Py_DECREF(row);
      return NULL;
    }
    PyTuple_SET_ITEM(row, c, v);
  }
  return row;
}

/*
 * Binds params (all of them of the kinds checked by simple_params()) to stmt;
 * SQLite's result.
 */
static int sq_bind(struct sqlite3_stmt *stmt, PyObject *const *items,
                   Py_ssize_t n) {
  int rc = 0;
  for (Py_ssize_t i = 0; i < n && rc == 0; i++) {
    PyObject *v = items[i];
    int at = (int)i + 1;
    if (v == Py_None) {
      rc = sq->bind_null(stmt, at);
    } else if (PyLong_CheckExact(v)) {
      rc = sq->bind_int64(stmt, at, PyLong_AsLongLong(v));
    } else if (PyFloat_CheckExact(v)) {
      rc = sq->bind_double(stmt, at, PyFloat_AS_DOUBLE(v));
    } else if (PyUnicode_CheckExact(v)) {
      Py_ssize_t len;
      const char *p = PyUnicode_AsUTF8AndSize(v, &len);
      rc = sq->bind_text(stmt, at, p, (int)len, SQ_TRANSIENT);
    } else {
      rc = sq->bind_blob(stmt, at, PyBytes_AS_STRING(v),
                         (int)PyBytes_GET_SIZE(v), SQ_TRANSIENT);
    }
  }
  return rc;
}

/* Puts stmt back in kept under key, or finalizes it. */
static int sq_give(PyObject *kept, PyObject *key, struct sqlite3_stmt *stmt,
                   int keep) {
  if (keep && PyDict_GET_SIZE(kept) < kept_limit) {
    PyObject *addr = PyLong_FromVoidPtr(stmt), *got;
    if (!addr) {
      sq->finalize(stmt);
      return -1;
    }
    got = PyDict_SetDefault(kept, key, addr);
    Py_DECREF(addr);
    if (!got) {
      sq->finalize(stmt);
      return -1;
    }
    if (got == addr)
      return 0;
  }
  sq->finalize(stmt);
  return 0;
}

/*
 * sqlite_execute(conn, sql, params, kept): conn the sqlite3 * (an int),
 * kept the dict of statements kept, by (conn, sql), as ints. Returns:
 *   - the Cursor;
 *   - (code, message) when SQLite refused the statement or its run (code
 *     SQLite's), or -1 when the parameters do not match the statement, -2
 *     when the text holds a second statement (then message is None);
 *   - NotImplemented when it leaves the call to Python, before running
 *     anything: sql not a str, params not a tuple or list, a parameter of
 *     another type (a subclass included), an int past 64 bits, a str that
 *     is not valid UTF-8, an empty statement.
 */
static PyObject *sp_sqlite_execute(PyObject *self, PyObject *const *args,
                                   Py_ssize_t nargs) {
  struct sqlite3 *db;
  struct sqlite3_stmt *stmt = NULL;
  PyObject *sql, *params, *kept, *key, *addr, *rows = NULL, *out = NULL;
  PyObject *const *items;
  const char *text, *tail = NULL;
  Py_ssize_t n, text_len;
  int rc, columns, simple;
  long long changes = 0, last_rowid = 0;
  (void)self;
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "sqlite_execute(conn, sql, params, kept)");
    return NULL;
  }
  if (!sq) {
    PyErr_SetString(PyExc_RuntimeError,
                    "idem._speedups: sqlite_setup() not called");
    return NULL;
  }
  sql = args[1];
  params = args[2];
  kept = args[3];
  if (!PyDict_CheckExact(kept)) {
    PyErr_SetString(PyExc_TypeError, "kept must be a dict");
    return NULL;
  }
  if (address(args[0], (void **)&db) < 0)
    return NULL;
  if (!PyUnicode_CheckExact(sql) ||
      !(PyTuple_CheckExact(params) || PyList_CheckExact(params)))
    Py_RETURN_NOTIMPLEMENTED;
  /* A list's items are read while the GIL is held throughout. */
  items = PySequence_Fast_ITEMS(params);
  n = PySequence_Fast_GET_SIZE(params);
  if (!(text = PyUnicode_AsUTF8AndSize(sql, &text_len))) {
    if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
      return NULL;
    PyErr_Clear();
    Py_RETURN_NOTIMPLEMENTED;
  }
  if (text_len > INT32_MAX || (simple = simple_params(items, n, 0)) == 0)
    Py_RETURN_NOTIMPLEMENTED;
  if (simple < 0)
    return NULL;
  if (!(key = PyTuple_Pack(2, args[0], sql)))
    return NULL;
  /* Take the kept statement out, so that no other call uses it meanwhile. */
  addr = PyDict_GetItemWithError(kept, key);
  if (addr) {
    stmt = PyLong_AsVoidPtr(addr);
    if (PyDict_DelItem(kept, key) < 0)
      goto fail;
    sq->clear_bindings(stmt);
  } else if (PyErr_Occurred()) {
    goto fail;
  } else {
    rc = sq->prepare_v2(db, text, (int)text_len, &stmt, &tail);
    if (rc != 0) {
      out = Py_BuildValue("(is)", rc, sq->errmsg(db));
      goto done;
    }
    if (!stmt) { /* no statement in the text: Python says what that does */
      Py_DECREF(key);
      Py_RETURN_NOTIMPLEMENTED;
    }
    if (tail && tail < text + text_len) {
      struct sqlite3_stmt *next = NULL;
      rc = sq->prepare_v2(db, tail, (int)(text + text_len - tail), &next, NULL);
      sq->finalize(next);
      if (next || rc != 0) {
        sq->finalize(stmt);
        out = Py_BuildValue("(iO)", -2, Py_None);
        goto done;
      }
    }
  }
  if (sq->bind_parameter_count(stmt) != n) {
    sq->finalize(stmt);
    out = Py_BuildValue("(iO)", -1, Py_None);
    goto done;
  }
  rc = sq_bind(stmt, items, n);
  if (rc == 0) {
    Py_BEGIN_ALLOW_THREADS
    rc = sq->step(stmt);
    Py_END_ALLOW_THREADS
  }
  columns = sq->column_count(stmt);
  changes = sq->changes(db);
  last_rowid = sq->last_insert_rowid(db);
  if (!(rows = PyList_New(0)))
    goto fail_stmt;
  while (rc == SQ_ROW) {
    PyObject *row = sq_row(stmt, columns);
    if (!row || PyList_Append(rows, row) < 0) {
      Py_XDECREF(row);
      goto fail_stmt;
    }
    Py_DECREF(row);
    if (PyErr_CheckSignals() < 0) /* Ctrl-C in a long read */
      goto fail_stmt;
    Py_BEGIN_ALLOW_THREADS
    rc = sq->step(stmt);
    Py_END_ALLOW_THREADS
  }
  if (rc != SQ_DONE) {
    out = Py_BuildValue("(is)", rc, sq->errmsg(db));
    sq->reset(stmt);
    sq->finalize(stmt);
    goto done;
  }
  sq->reset(stmt); /* ends its read: the statement may be kept */
  if (sq_give(kept, key, stmt, 1) < 0)
    goto fail;
  {
    long long count = columns || PyList_GET_SIZE(rows)
                          ? -1
                          : is_dml(text, text_len) ? changes : -1;
    PyObject *cargs[3] = {rows, NULL, NULL};
    if (!(cargs[1] = PyLong_FromLongLong(count)))
      goto fail;
    if (!(cargs[2] = PyLong_FromLongLong(last_rowid))) {
      Py_DECREF(cargs[1]);
      goto fail;
    }
    out = PyObject_Vectorcall(cursor_cls, cargs, 3, NULL);
    Py_DECREF(cargs[1]);
    Py_DECREF(cargs[2]);
  }
done:
  Py_XDECREF(rows);
  Py_DECREF(key);
  return out;
fail_stmt:
  /* A statement left mid-step holds a read on the store's connection. */
  sq->reset(stmt);
  sq->finalize(stmt);
fail:
  Py_XDECREF(rows);
  Py_DECREF(key);
  return NULL;
}

static PyObject *sp_sqlite_setup(PyObject *self, PyObject *args) {
  PyObject *a, *cls;
  void *ap;
  Py_ssize_t limit;
  (void)self;
  if (!PyArg_ParseTuple(args, "OOn", &a, &cls, &limit))
    return NULL;
  if (address(a, &ap) < 0)
    return NULL;
  if (!ap || ((const idem_py_sqlite_api *)ap)->size != sizeof *sq ||
      !PyCallable_Check(cls) || limit < 0) {
    PyErr_SetString(PyExc_ValueError,
                    "sqlite_setup(api, Cursor, limit): api is not "
                    "idem_py_sqlite_fns() of this build");
    return NULL;
  }
  Py_INCREF(cls);
  Py_XSETREF(cursor_cls, cls);
  kept_limit = limit;
  sq = ap;
  Py_RETURN_NONE;
}

/* ----------------------------------------- tx.execute() on PostgreSQL */

/*
 * tx.execute(sql, params) on the store's PostgreSQL connection: the
 * parameters written as text (bytes as binary), the statement sent prepared
 * (by the name idem._tx's cache gives) or with its text, and its rows read
 * into Python values by their type, in one crossing. The cache's
 * bookkeeping stays in Python, told what it needs of the result.
 */
static const idem_py_pg_api *pq;

enum { PG_COMMAND_OK = 1, PG_TUPLES_OK = 2 };
enum { PG_BOOL = 16, PG_BYTEA = 17, PG_INT8 = 20, PG_INT2 = 21, PG_INT4 = 23,
       PG_OID = 26, PG_FLOAT4 = 700, PG_FLOAT8 = 701, PG_NUMERIC = 1700 };

/* Commands after which a session's prepared statements may mean otherwise
 * (idem._tx._PG_RESETS). */
static int pg_resets(const char *status) {
  static const char *const words[] = {"CREATE", "ALTER", "DROP", "SET",
                                      "RESET", "DISCARD", "DEALLOCATE"};
  for (size_t i = 0; status && i < sizeof words / sizeof words[0]; i++)
    if (strncmp(status, words[i], strlen(words[i])) == 0)
      return 1;
  return 0;
}

static int hex_digit(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* One value as idem._tx._pg_value() reads it. */
static PyObject *pg_value(unsigned int oid, const char *raw, int len) {
  switch (oid) {
  case PG_INT8:
  case PG_INT2:
  case PG_INT4:
  case PG_OID:
    return PyLong_FromString(raw, NULL, 10);
  case PG_FLOAT4:
  case PG_FLOAT8:
  case PG_NUMERIC: {
    double d = PyOS_string_to_double(raw, NULL, PyExc_ValueError);
    return d == -1.0 && PyErr_Occurred() ? NULL : PyFloat_FromDouble(d);
  }
  case PG_BOOL:
    return PyBool_FromLong(len == 1 && raw[0] == 't');
  case PG_BYTEA:
    if (len >= 2 && raw[0] == '\\' && raw[1] == 'x') {
      PyObject *out;
      char *p;
      int n = (len - 2) / 2;
      if ((len - 2) % 2)
        goto bad_hex;
      if (!(out = PyBytes_FromStringAndSize(NULL, n)))
        return NULL;
      p = PyBytes_AS_STRING(out);
      for (int i = 0; i < n; i++) {
        int hi = hex_digit(raw[2 + 2 * i]), lo = hex_digit(raw[3 + 2 * i]);
        if (hi < 0 || lo < 0) {
          Py_DECREF(out);
          goto bad_hex;
        }
        p[i] = (char)(hi << 4 | lo);
      }
      return out;
    }
    return PyBytes_FromStringAndSize(raw, len);
  bad_hex:
    PyErr_SetString(PyExc_ValueError, "bytea: not hex");
    return NULL;
  default:
    return PyUnicode_DecodeUTF8(raw, len, "replace");
  }
}

static PyObject *pg_rows(struct pg_result *res) {
  int nrows = pq->ntuples(res), ncols = pq->nfields(res);
  unsigned int types[64], *oids = types;
  PyObject *rows = PyList_New(nrows);
  if (!rows)
    return NULL;
  if (ncols > 64 && !(oids = PyMem_Malloc(sizeof *oids * (size_t)ncols))) {
    Py_DECREF(rows);
    return PyErr_NoMemory();
  }
  for (int c = 0; c < ncols; c++)
    oids[c] = pq->ftype(res, c);
  for (int r = 0; r < nrows; r++) {
    PyObject *row = PyTuple_New(ncols), *v;
    if (!row)
      goto fail;
    PyList_SET_ITEM(rows, r, row);
    for (int c = 0; c < ncols; c++) {
      if (pq->getisnull(res, r, c)) {
        Py_INCREF(Py_None);
        v = Py_None;
      } else if (!(v = pg_value(oids[c], pq->getvalue(res, r, c),
                                pq->getlength(res, r, c)))) {
        goto fail;
      }
      PyTuple_SET_ITEM(row, c, v);
    }
  }
  if (oids != types)
    PyMem_Free(oids);
  return rows;
fail:
  if (oids != types)
    PyMem_Free(oids);
  Py_DECREF(rows);
  return NULL;
}

/*
 * pg_execute(conn, sql, name, params): conn the PGconn * (an int), sql the
 * text (bytes), name the statement's prepared name (bytes) or None to send
 * the text. Returns:
 *   - (Cursor, resets): the statement ran; resets whether it was a command
 *     after which the session's prepared statements may mean otherwise;
 *   - (None, sqlstate, message): it failed (sqlstate bytes, or None);
 *   - NotImplemented when it leaves the call to Python, before sending
 *     anything: params not a tuple or list, a parameter of another type (a
 *     subclass included, but bool), an int past 64 bits, a str with a NUL
 *     or that is not valid UTF-8.
 */
static PyObject *sp_pg_execute(PyObject *self, PyObject *const *args,
                               Py_ssize_t nargs) {
  struct pg_conn *conn;
  struct pg_result *res;
  PyObject *sql, *name, *params, *out = NULL;
  PyObject *const *items;
  Py_ssize_t n;
  enum { SMALL = 16 };
  const char *small_values[SMALL];
  int small_lengths[SMALL], small_formats[SMALL];
  char small_text[SMALL][32];
  const char **values = small_values;
  int *lengths = small_lengths, *formats = small_formats;
  char(*text)[32] = small_text;
  char **floats = NULL;
  int simple, status;
  (void)self;
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "pg_execute(conn, sql, name, params)");
    return NULL;
  }
  if (!pq) {
    PyErr_SetString(PyExc_RuntimeError, "idem._speedups: pg_setup() not called");
    return NULL;
  }
  sql = args[1];
  name = args[2];
  params = args[3];
  if (address(args[0], (void **)&conn) < 0)
    return NULL;
  if (!PyBytes_CheckExact(sql) || (name != Py_None && !PyBytes_CheckExact(name))) {
    PyErr_SetString(PyExc_TypeError, "sql and name must be bytes");
    return NULL;
  }
  if (!(PyTuple_CheckExact(params) || PyList_CheckExact(params)))
    Py_RETURN_NOTIMPLEMENTED;
  items = PySequence_Fast_ITEMS(params);
  n = PySequence_Fast_GET_SIZE(params);
  if ((simple = simple_params(items, n, 1)) <= 0) {
    if (simple < 0)
      return NULL;
    Py_RETURN_NOTIMPLEMENTED;
  }
  if (n > SMALL) {
    values = PyMem_Calloc((size_t)n, sizeof *values);
    lengths = PyMem_Calloc((size_t)n, sizeof *lengths);
    formats = PyMem_Calloc((size_t)n, sizeof *formats);
    text = PyMem_Calloc((size_t)n, sizeof *text);
    if (!values || !lengths || !formats || !text) {
      PyErr_NoMemory();
      goto done;
    }
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *v = items[i];
    formats[i] = 0;
    if (v == Py_None) {
      values[i] = NULL;
      lengths[i] = 0;
    } else if (v == Py_True || v == Py_False) {
      values[i] = v == Py_True ? "true" : "false";
      lengths[i] = (int)strlen(values[i]);
    } else if (PyLong_CheckExact(v)) {
      lengths[i] = snprintf(text[i], sizeof text[i], "%lld", PyLong_AsLongLong(v));
      values[i] = text[i];
    } else if (PyFloat_CheckExact(v)) {
      /* float.__repr__'s text: what the Python way sends. */
      char *r = PyOS_double_to_string(PyFloat_AS_DOUBLE(v), 'r', 0,
                                      Py_DTSF_ADD_DOT_0, NULL);
      if (!r)
        goto done;
      if (!floats && !(floats = PyMem_Calloc((size_t)n, sizeof *floats))) {
        PyMem_Free(r);
        PyErr_NoMemory();
        goto done;
      }
      floats[i] = r;
      values[i] = r;
      lengths[i] = (int)strlen(r);
    } else if (PyUnicode_CheckExact(v)) {
      Py_ssize_t len;
      values[i] = PyUnicode_AsUTF8AndSize(v, &len);
      lengths[i] = (int)len;
    } else {
      values[i] = PyBytes_AS_STRING(v);
      lengths[i] = (int)PyBytes_GET_SIZE(v);
      formats[i] = 1; /* binary: sent as it is */
    }
  }
  Py_BEGIN_ALLOW_THREADS
  res = name != Py_None
            ? pq->exec_prepared(conn, PyBytes_AS_STRING(name), (int)n, values,
                                lengths, formats, 0)
            : pq->exec_params(conn, PyBytes_AS_STRING(sql), (int)n, NULL, values,
                              lengths, formats, 0);
  Py_END_ALLOW_THREADS
  status = res ? pq->result_status(res) : -1;
  if (status == PG_COMMAND_OK || status == PG_TUPLES_OK) {
    PyObject *rows = pg_rows(res), *cursor = NULL, *count = NULL;
    const char *tuples = pq->cmd_tuples(res);
    if (rows && (count = PyLong_FromLongLong(tuples && *tuples
                                                  ? strtoll(tuples, NULL, 10)
                                                  : -1))) {
      PyObject *cargs[3] = {rows, count, Py_None};
      cursor = PyObject_Vectorcall(cursor_cls, cargs, 3, NULL);
    }
    if (cursor)
      out = Py_BuildValue("(NO)", cursor,
                          pg_resets(pq->cmd_status(res)) ? Py_True : Py_False);
    Py_XDECREF(rows);
    Py_XDECREF(count);
  } else {
    const char *state = res ? pq->result_error_field(res, 'C') : NULL;
    const char *msg = res ? pq->result_error_message(res) : NULL;
    PyObject *m;
    size_t len = msg ? strlen(msg) : 0;
    while (len && (msg[len - 1] == '\n' || msg[len - 1] == ' '))
      len--; /* the Python way strips it */
    while (len && (*msg == ' ' || *msg == '\n'))
      msg++, len--;
    m = msg && len ? PyUnicode_DecodeUTF8(msg, (Py_ssize_t)len, "replace")
                   : PyUnicode_FromString(res ? "" : "no result");
    if (m)
      out = Py_BuildValue("(OyN)", Py_None, state, m);
  }
  if (res)
    pq->clear(res);
done:
  if (floats) {
    for (Py_ssize_t i = 0; i < n; i++)
      PyMem_Free(floats[i]);
    PyMem_Free(floats);
  }
  if (values != small_values) {
    PyMem_Free(values);
    PyMem_Free(lengths);
    PyMem_Free(formats);
    PyMem_Free(text);
  }
  return out;
}

/* pg_simple(params): whether pg_execute() sends params itself. */
static PyObject *sp_pg_simple(PyObject *self, PyObject *params) {
  int simple;
  (void)self;
  if (!(PyTuple_CheckExact(params) || PyList_CheckExact(params)))
    Py_RETURN_FALSE;
  simple = simple_params(PySequence_Fast_ITEMS(params),
                         PySequence_Fast_GET_SIZE(params), 1);
  if (simple < 0)
    return NULL;
  return PyBool_FromLong(simple);
}

static PyObject *sp_pg_setup(PyObject *self, PyObject *args) {
  PyObject *a;
  void *ap;
  (void)self;
  if (!PyArg_ParseTuple(args, "O", &a))
    return NULL;
  if (address(a, &ap) < 0)
    return NULL;
  if (!ap || ((const idem_py_pg_api *)ap)->size != sizeof *pq || !cursor_cls) {
    PyErr_SetString(PyExc_ValueError,
                    "pg_setup(api): api is not idem_py_pg_fns() of this "
                    "build, or sqlite_setup() was not called first");
    return NULL;
  }
  pq = ap;
  Py_RETURN_NONE;
}

static PyObject *sp_dumps(PyObject *self, PyObject *o) {
  text t;
  int rc;
  PyObject *out;
  (void)self;
  text_init(&t);
  rc = put_value(&t, o, 0);
  out = rc == 0 ? PyBytes_FromStringAndSize(t.p, (Py_ssize_t)t.len) : NULL;
  text_free(&t);
  if (rc > 0)
    Py_RETURN_NOTIMPLEMENTED;
  return out;
}

static PyMethodDef methods[] = {
    {"setup", sp_setup, METH_VARARGS,
     "setup(Outcome, scan): the class of a call's result and json's "
     "scanner."},
    {"local_setup", sp_local_setup, METH_VARARGS,
     "local_setup(local, respond, fresh, rejected, dump): the addresses of "
     "idem_py_local_fresh and idem_py_respond, IDEM_PY_FRESH, "
     "IDEM_EREJECTED and the function that writes a result as JSON bytes "
     "for what this module leaves to Python."},
    {"local", (PyCFunction)(void (*)(void))sp_local, METH_FASTCALL,
     "local(store, tenant, operation, key, request, opts, fn, owner, tx_new, "
     "claim, buf, cap)"},
    {"calls_setup", sp_calls_setup, METH_VARARGS,
     "calls_setup(names, spares, take, plain, cap): what local_call() reads "
     "of idem._store."},
    {"local_call", (PyCFunction)(void (*)(void))sp_local_call, METH_FASTCALL,
     "local_call(owner, operation, key, request, fn, tenant): "
     "Store.execute_local() with no options, whole."},
    {"once_setup", sp_once_setup, METH_VARARGS,
     "once_setup(held, finish, done, not_done, unknown, NotDone, "
     "result_body, end_failed): the addresses of idem_py_begin_held and "
     "idem_py_finish, idem_exec_result's three values, idem.NotDone, "
     "the function that writes a result as JSON bytes for what this module "
     "leaves to Python, and the one that makes the error of an ending that "
     "failed."},
    {"once", (PyCFunction)(void (*)(void))sp_once, METH_FASTCALL,
     "once(store, tenant, operation, key, request, opts, claim, buf, cap, "
     "fn, args, kwargs, release_on): the decorator's call."},
    {"once_call", (PyCFunction)(void (*)(void))sp_once_call, METH_FASTCALL,
     "once_call(owner, tenant, operation, key, arguments, opts, fn, args, "
     "kwargs, release_on): a decorated call whose key is an argument, "
     "whole."},
    {"local_store", sp_local_store, METH_NOARGS,
     "local_store(): the Store whose function runs on this thread, or None."},
    {"swap_local", sp_swap_local, METH_O,
     "swap_local(store): marks store (or None) as running a function on "
     "this thread; returns the one marked before."},
    {"sqlite_setup", sp_sqlite_setup, METH_VARARGS,
     "sqlite_setup(api, Cursor, limit): the address of idem._native's "
     "idem_py_sqlite_fns(), the class of tx.execute()'s result and how many "
     "statements to keep."},
    {"sqlite_execute", (PyCFunction)(void (*)(void))sp_sqlite_execute,
     METH_FASTCALL,
     "sqlite_execute(conn, sql, params, kept): tx.execute() on SQLite: a "
     "Cursor, (code, message), or NotImplemented."},
    {"pg_setup", sp_pg_setup, METH_VARARGS,
     "pg_setup(api): the address of idem._native's idem_py_pg_fns()."},
    {"pg_execute", (PyCFunction)(void (*)(void))sp_pg_execute, METH_FASTCALL,
     "pg_execute(conn, sql, name, params): tx.execute() on PostgreSQL: "
     "(Cursor, resets), (None, sqlstate, message), or NotImplemented."},
    {"pg_simple", sp_pg_simple, METH_O,
     "pg_simple(params): whether pg_execute() sends these parameters "
     "itself."},
    {"dumps", sp_dumps, METH_O,
     "dumps(value): the JSON this module sends for value (bytes), or "
     "NotImplemented when it leaves value to Python's json."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "idem._speedups",
                                    "The replay of a call, and tx.execute(), in one crossing.",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__speedups(void) {
  PyObject *m;
  if (!zero && !(zero = PyLong_FromLong(0)))
    return NULL;
  if (PyType_Ready(&outcome_base) < 0)
    return NULL;
  m = PyModule_Create(&module);
  if (m && PyModule_AddObjectRef(m, "OutcomeBase", (PyObject *)&outcome_base) < 0)
    Py_CLEAR(m);
  return m;
}
