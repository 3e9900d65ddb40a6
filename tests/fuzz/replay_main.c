/*
 * replay_main.c -- runs a fuzz driver without libFuzzer: every file named
 * on the command line (or found in a folder named there) is read into a
 * buffer of exactly its size and given to LLVMFuzzerTestOneInput() once.
 *
 * This is how the inputs that once made a driver fail (kept in
 * tests/fuzz/regress/NAME/) and the seed corpora run in `make check`, with
 * gcc and in both builds, so that a defect a fuzzer found stays fixed. A
 * driver reports a violated property with abort(); this program then dies
 * with the signal and ctest counts the test as failed. It prints how many
 * inputs it ran, and fails when it ran none, so that a corpus folder gone
 * missing is not a silent pass.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static long ran;

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  struct stat st;
  uint8_t *buf;
  size_t n;
  if (!f || fstat(fileno(f), &st) != 0) {
    fprintf(stderr, "fuzz replay: cannot read %s\n", path);
    if (f)
      fclose(f);
    return -1;
  }
  /* Exactly the input's size: a read past its end is an ASan report. */
  buf = malloc(st.st_size > 0 ? (size_t)st.st_size : 1);
  if (!buf) {
    fclose(f);
    return -1;
  }
  n = fread(buf, 1, (size_t)st.st_size, f);
  fclose(f);
  if (n != (size_t)st.st_size) {
    fprintf(stderr, "fuzz replay: short read of %s\n", path);
    free(buf);
    return -1;
  }
  LLVMFuzzerTestOneInput(buf, n);
  free(buf);
  ran++;
  return 0;
}

static int run_path(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) {
    fprintf(stderr, "fuzz replay: %s: no such file or folder\n", path);
    return -1;
  }
  if (!S_ISDIR(st.st_mode))
    return run_file(path);
  DIR *d = opendir(path);
  struct dirent *e;
  int rc = 0;
  if (!d)
    return -1;
  while ((e = readdir(d)) && rc == 0) {
    char sub[4096];
    if (e->d_name[0] == '.')
      continue;
    snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
    rc = run_path(sub);
  }
  closedir(d);
  return rc;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (run_path(argv[i]) != 0)
      return 1;
  printf("fuzz replay: %ld inputs, no property violated\n", ran);
  return ran > 0 ? 0 : 1;
}
