/*
 * fuzz_run_record.c -- `idem run`'s decoder of a stored record
 * (decode_record() in src/run/cmd_run.c, which replay() trusts to split the
 * stored body into standard output and standard error). src/run/cmd_run.c is
 * included, as h2o's drivers do, to reach its static functions.
 *
 * Input: byte 0 chooses the shape, bytes 1-2 the length of the metadata,
 * then the metadata and the body, each in a heap buffer of exactly its
 * size. Properties checked:
 *  - whatever the metadata (any bytes, or none), decoding either refuses
 *    the record or gives an output length within the body, and without
 *    metadata the whole body is output;
 *  - metadata as run_action() writes it, for a split of the body the
 *    input chooses, decodes to exactly that split and truncation flag.
 */
#include "../../src/run/cmd_run.c"

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "fuzz_run_record: property violated: %s (line %d)\n",    \
              #cond, __LINE__);                                                \
      abort();                                                                 \
    }                                                                          \
  } while (0)

static void *dup_exact(const uint8_t *p, size_t n) {
  void *d = malloc(n ? n : 1);
  if (d && n)
    memcpy(d, p, n);
  return d;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 3)
    return 0;
  unsigned shape = data[0];
  size_t meta_len = (size_t)data[1] << 8 | data[2];
  data += 3;
  size -= 3;
  if (meta_len > size)
    meta_len = size;
  void *meta = dup_exact(data, meta_len);
  void *body = dup_exact(data + meta_len, size - meta_len);
  size_t body_len = size - meta_len, out_len = 12345;
  int truncated = -1;
  idem_response r = {(int)shape, NULL, 0, body, body_len};
  if (!meta || !body)
    goto out;
  if (shape & 1) {
    r.meta = meta;
    r.meta_len = meta_len;
  }
  if (decode_record(&r, &out_len, &truncated) == 0) {
    CHECK(out_len <= body_len);
    CHECK(truncated == 0 || truncated == 1);
    if (!r.meta)
      CHECK(out_len == body_len && truncated == 0);
  } else {
    CHECK(r.meta != NULL);
    CHECK(out_len == 0);
  }
  /* What run_action() writes, for a split the input chooses. */
  {
    char m[160];
    size_t split = body_len ? (meta_len * 7919u + shape) % (body_len + 1) : 0;
    int cut = (shape >> 1) & 1;
    snprintf(m, sizeof m, "{\"stderr\":%zu,\"stdout\":%zu,\"truncated\":%s}",
             body_len - split, split, cut ? "true" : "false");
    void *exact = dup_exact((const uint8_t *)m, strlen(m));
    CHECK(exact != NULL);
    r.meta = exact;
    r.meta_len = strlen(m);
    CHECK(decode_record(&r, &out_len, &truncated) == 0);
    CHECK(out_len == split && truncated == cut);
    free(exact);
  }
out:
  free(meta);
  free(body);
  return 0;
}
