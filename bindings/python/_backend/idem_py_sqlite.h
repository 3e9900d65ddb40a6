/*
 * idem_py_sqlite.h -- the SQLite and libpq functions idem._native hands to
 * idem._speedups, so that tx.execute() in C calls the SQLite or libpq that
 * owns the store's connection (the one libidem was linked with) and needs
 * no header or library of its own.
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

/* libpq's, likewise (idem_py_pg_fns(), when the package has libpq). */
struct pg_conn;
struct pg_result;

typedef struct idem_py_pg_api {
  size_t size; /* sizeof (idem_py_pg_api) */
  struct pg_result *(*exec_params)(struct pg_conn *conn, const char *command,
                                   int n, const unsigned int *types,
                                   const char *const *values,
                                   const int *lengths, const int *formats,
                                   int result_format);
  struct pg_result *(*exec_prepared)(struct pg_conn *conn, const char *name,
                                     int n, const char *const *values,
                                     const int *lengths, const int *formats,
                                     int result_format);
  int (*result_status)(const struct pg_result *res);
  char *(*result_error_message)(const struct pg_result *res);
  char *(*result_error_field)(const struct pg_result *res, int field);
  int (*ntuples)(const struct pg_result *res);
  int (*nfields)(const struct pg_result *res);
  unsigned int (*ftype)(const struct pg_result *res, int col);
  char *(*getvalue)(const struct pg_result *res, int row, int col);
  int (*getlength)(const struct pg_result *res, int row, int col);
  int (*getisnull)(const struct pg_result *res, int row, int col);
  char *(*cmd_tuples)(struct pg_result *res);
  char *(*cmd_status)(struct pg_result *res);
  void (*clear)(struct pg_result *res);
} idem_py_pg_api;

#endif
