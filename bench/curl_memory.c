/*
 * bench/curl_memory.c -- what libcurl itself holds for a transfer waiting
 * for its answer, with the options idem serve's forwards use
 * (src/serve/upstream.c): the floor under the gateway's memory per forward
 * (docs/bench.md, "slow upstream").
 *
 * Usage: curl_memory URL N
 *
 * Starts N POSTs to URL at once on one multi handle (URL should answer
 * slowly: bench/slow_upstream.py) and prints, from mallinfo2(), the heap
 * in use per transfer once the handles are made and at the peak while
 * they wait, and with libcurl's default receive buffer for comparison.
 */
#include <curl/curl.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>

static size_t discard(char *p, size_t size, size_t n, void *arg) {
  (void)p, (void)arg;
  return size * n;
}

/* One round of n transfers; buffer 0: libcurl's default. */
static int round_of(const char *url, int n, long buffer) {
  CURLM *m = curl_multi_init();
  CURL **h = calloc((size_t)n, sizeof *h);
  size_t base, made, peak = 0;
  int running = 1;

  if (!m || !h)
    return -1;
  curl_multi_setopt(m, CURLMOPT_MAXCONNECTS, 256L);
  base = mallinfo2().uordblks;
  for (int i = 0; i < n; i++) {
    CURL *c = h[i] = curl_easy_init();
    if (!c)
      return -1;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(c, CURLOPT_PROXY, "");
    if (buffer)
      curl_easy_setopt(c, CURLOPT_BUFFERSIZE, buffer);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, "{\"title\":\"t\"}");
    curl_multi_add_handle(m, c);
  }
  made = mallinfo2().uordblks;
  while (running) {
    size_t used;
    CURLMsg *msg;
    int left;
    curl_multi_perform(m, &running);
    used = mallinfo2().uordblks;
    if (used > peak)
      peak = used;
    curl_multi_poll(m, NULL, 0, 100, NULL);
    while ((msg = curl_multi_info_read(m, &left)) != NULL)
      ;
  }
  printf("buffer %-8s  per transfer: %6.0f B made, %6.0f B at the peak "
         "(%6.0f B more while it waits)\n",
         buffer ? "1 KB" : "default", (double)(made - base) / n,
         (double)(peak - base) / n, (double)(peak - made) / n);
  for (int i = 0; i < n; i++) {
    curl_multi_remove_handle(m, h[i]);
    curl_easy_cleanup(h[i]);
  }
  free(h);
  curl_multi_cleanup(m);
  return 0;
}

int main(int argc, char **argv) {
  int n = argc == 3 ? atoi(argv[2]) : 0;
  if (n <= 0) {
    fprintf(stderr, "usage: curl_memory URL N\n");
    return 2;
  }
  curl_global_init(CURL_GLOBAL_DEFAULT);
  if (round_of(argv[1], n, 1024L) != 0 || round_of(argv[1], n, 0) != 0) {
    fprintf(stderr, "curl_memory: out of memory\n");
    return 1;
  }
  curl_global_cleanup();
  return 0;
}
