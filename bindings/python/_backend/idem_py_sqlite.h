/*
 * idem_py_sqlite.h -- the SQLite functions idem._native hands to
 * idem._speedups, so that tx.execute() in C calls the SQLite that owns the
 * store's connection (the one libidem was linked with) and needs no
 * sqlite3.h or library of its own.
 *
 * idem._native fills one such table (idem_py_sqlite_fns()); idem._speedups
 * takes its address in sqlite_setup() and checks size before using it.
 */
#ifndef IDEM_PY_SQLITE_H
#define IDEM_PY_SQLITE_H

#include <stddef.h>

struct sqlite3;
struct sqlite3_stmt;

typedef struct idem_py_sqlite_api {
  size_t size; /* sizeof (idem_py_sqlite_api) */
  int (*prepare_v2)(struct sqlite3 *db, const char *sql, int len,
                    struct sqlite3_stmt **stmt, const char **tail);
  int (*bind_parameter_count)(struct sqlite3_stmt *stmt);
  int (*bind_null)(struct sqlite3_stmt *stmt, int i);
  int (*bind_int64)(struct sqlite3_stmt *stmt, int i, long long v);
  int (*bind_double)(struct sqlite3_stmt *stmt, int i, double v);
  int (*bind_text)(struct sqlite3_stmt *stmt, int i, const char *p, int len,
                   void (*destructor)(void *));
  int (*bind_blob)(struct sqlite3_stmt *stmt, int i, const void *p, int len,
                   void (*destructor)(void *));
  int (*step)(struct sqlite3_stmt *stmt);
  int (*reset)(struct sqlite3_stmt *stmt);
  int (*clear_bindings)(struct sqlite3_stmt *stmt);
  int (*finalize)(struct sqlite3_stmt *stmt);
  int (*column_count)(struct sqlite3_stmt *stmt);
  int (*column_type)(struct sqlite3_stmt *stmt, int i);
  long long (*column_int64)(struct sqlite3_stmt *stmt, int i);
  double (*column_double)(struct sqlite3_stmt *stmt, int i);
  const unsigned char *(*column_text)(struct sqlite3_stmt *stmt, int i);
  const void *(*column_blob)(struct sqlite3_stmt *stmt, int i);
  int (*column_bytes)(struct sqlite3_stmt *stmt, int i);
  int (*changes)(struct sqlite3 *db);
  long long (*last_insert_rowid)(struct sqlite3 *db);
  const char *(*errmsg)(struct sqlite3 *db);
} idem_py_sqlite_api;

#endif
