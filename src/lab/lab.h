/* lab.h -- what the `idem lab` suites share. */
#ifndef IDEM_LAB_H
#define IDEM_LAB_H

#include <jansson.h>

#include "cli.h"

/*
 * A lab run: where its fresh databases go, and what it has observed.
 * Every scenario gets a database of its own, made by lab_fresh_store().
 */
typedef struct lab {
  const char *store_arg; /* --store as given, or NULL */
  char dir[200];         /* temporary folder of this run (SQLite) */
  int seq;               /* numbers the fresh databases */
  int failures;
  int passed;
  json_t *suites; /* suite name -> {"scenarios": {name: values}} */
  json_t *current; /* the running suite's scenarios object */
  char engine_version[64]; /* of the store's database engine */
  int pg;                  /* the store is PostgreSQL */
  char *made[64];          /* PostgreSQL: the schemas this run made */
  int nmade;
} lab;

/* One fresh store for a scenario: its URL (written to url) and the path of
 * its database for the lab's own side-effect tables. */
int lab_fresh_store(lab *L, const char *name, char *url, size_t url_size);

/* Prints "name: {json}" with sorted keys and records it in the evidence. */
void lab_report(lab *L, const char *name, json_t *values);

/* A check that holds in every build type: on failure, names the scenario,
 * the expectation and the observation, and counts a failure. Returns cond. */
int lab_check(lab *L, const char *scenario, int cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Sleeps ms milliseconds. */
void lab_sleep_ms(int ms);

/* ---- side effects in the store's own database (lab_db.c) ---------------- */

/* Creates the lab's tables (tickets, accounts) next to the idem records. */
int lab_db_setup(const char *url);
/* Inside a local action: inserts a ticket on the transaction's connection. */
int lab_db_insert_ticket(void *conn, const char *payload, long long *id);
/* Outside idem: one transaction of its own (the naive path). */
int lab_db_insert_ticket_alone(const char *url, const char *payload,
                               long long *id);
long long lab_db_count_tickets(const char *url);
/* Inside a local action: credits an existing account; returns 1 when the
 * account does not exist (a domain rejection). */
int lab_db_credit(void *conn, const char *tenant, const char *account,
                  long long amount, long long *balance, long long *version);
int lab_db_open_account(const char *url, const char *tenant,
                        const char *account);
long long lab_db_balance(const char *url, const char *tenant,
                         const char *account);
/* Number of idem records in the store, expired ones included. */
long long lab_count_records(const char *url);
/* PostgreSQL: drops the scenario's schema (a no-op on SQLite). */
int lab_db_drop(const char *url);
/* PostgreSQL: 0 when the server answers, else -1 after saying why. */
int lab_db_reachable(const char *url);
const char *lab_db_sqlite_version(void);

int lab_suite_tickets(lab *L);
int lab_suite_credit(lab *L);
int lab_suite_recovery(lab *L);

#endif
