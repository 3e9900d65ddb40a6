/*
 * mcp_out.c -- what the stdio proxy writes: whole lines to the client or
 * the server, its JSON-RPC error answers, and the main loop's wake-up. The
 * relay (mcp_relay.c) and the keyed calls (mcp_keyed.c) both write through
 * it.
 */
#include "mcp.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

static int writev_all(int fd, struct iovec *iov, int n) {
  while (n > 0) {
    ssize_t w = writev(fd, iov, n);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    while (n > 0 && (size_t)w >= iov->iov_len) {
      w -= (ssize_t)iov->iov_len;
      iov++;
      n--;
    }
    if (n > 0) {
      iov->iov_base = (char *)iov->iov_base + w;
      iov->iov_len -= (size_t)w;
    }
  }
  return 0;
}

int mcp_out_locked(mcp_out *out, const char *data, size_t len, int nl) {
  struct iovec iov[2] = {{(void *)data, len}, {(void *)"\n", 1}};
  if (out->fd < 0 || out->broken)
    return -1;
  if (writev_all(out->fd, iov, nl ? 2 : 1) != 0) {
    out->broken = 1;
    return -1;
  }
  return 0;
}

int mcp_out_line(mcp_out *out, const char *line, size_t len) {
  pthread_mutex_lock(&out->lock);
  int rc = mcp_out_locked(out, line, len, 1);
  pthread_mutex_unlock(&out->lock);
  return rc;
}

int mcp_out_json(mcp_out *out, json_t *msg) {
  char *text = json_dumps(msg, JSON_COMPACT);
  if (!text)
    return -1;
  int rc = mcp_out_line(out, text, strlen(text));
  free(text);
  return rc;
}

void mcp_notify(mcp_proxy *p) {
  char b = 0;
  if (write(p->event_fd, &b, 1) < 0) {
    /* A full pipe already holds a wake-up. */
  }
}

json_t *mcp_error_object(int code, const char *msg) {
  size_t n = cli_utf8_cut(msg, strlen(msg));
  json_t *err = json_pack("{s:i,s:s%}", "code", code, "message", msg, n);
  if (!err) {
    char *shown = cli_escape(msg, n);
    if (shown)
      err = json_pack("{s:i,s:s}", "code", code, "message", shown);
    free(shown);
  }
  return err;
}

void mcp_answer_error(mcp_proxy *p, json_t *id, int code, const char *msg,
                      json_t *data) {
  json_t *err = mcp_error_object(code, msg);
  json_t *m = NULL;
  if (err && data)
    json_object_set_new(err, "data", data);
  else
    json_decref(data);
  if (err)
    m = json_pack("{s:s,s:O,s:o}", "jsonrpc", "2.0", "id",
                  id ? id : json_null(), "error", err);
  if (m)
    mcp_out_json(&p->to_client, m);
  json_decref(m);
}

void mcp_answer_error_text(mcp_proxy *p, const char *id, int code,
                           const char *msg, json_t *data) {
  json_t *err = mcp_error_object(code, msg);
  char *etext = NULL, *line = NULL;
  if (err && data)
    json_object_set_new(err, "data", data);
  else
    json_decref(data);
  if (err)
    etext = json_dumps(err, JSON_COMPACT);
  json_decref(err);
  if (!id)
    id = "null";
  if (etext) {
    size_t n = strlen(etext) + strlen(id) + 48;
    line = malloc(n);
    if (line)
      snprintf(line, n, "{\"jsonrpc\":\"2.0\",\"id\":%s,\"error\":%s}", id,
               etext);
  }
  if (line)
    mcp_out_line(&p->to_client, line, strlen(line));
  free(line);
  free(etext);
}
