/* pool.c - PLACEHOLDER serial implementation of the tern_pool API so other
 * layers can build; replaced by the real persistent pool (issue 2). */
#include <stdlib.h>

#include "common.h"

struct tern_pool {
    void *scratch;
    size_t scratch_size;
};

tern_pool_t *tern_pool_create(int n_threads, size_t scratch_bytes, tern_error_t *err) {
    (void)n_threads;
    tern_pool_t *p = calloc(1, sizeof *p);
    if (!p) {
        tern_err(err, TERN_ENOMEM, "pool: out of memory");
        return NULL;
    }
    p->scratch = tern_alloc(scratch_bytes);
    p->scratch_size = scratch_bytes;
    return p;
}
void tern_pool_free(tern_pool_t *p) {
    if (!p) return;
    tern_free(p->scratch);
    free(p);
}
int tern_pool_threads(const tern_pool_t *p) { (void)p; return 1; }
int tern_pool_run(tern_pool_t *p, const tern_range_t *r, int n, tern_error_t *err) {
    (void)p;
    for (int i = 0; i < n; i++) {
        if (r[i].n_rows <= 0) continue;
        int rc = r[i].fn(r[i].ctx, 0, r[i].n_rows, 0);
        if (rc) return tern_err(err, TERN_EJOB, "pool: range %d failed with %d", i, rc);
    }
    return 0;
}
void *tern_pool_scratch(tern_pool_t *p, int w) { (void)w; return p ? p->scratch : NULL; }
size_t tern_pool_scratch_size(const tern_pool_t *p) { return p ? p->scratch_size : 0; }
uint64_t tern_pool_dispatch_count(void) { return 0; }
int tern_threads_default(char *why, size_t n) {
    if (why && n) why[0] = 0;
    return 1;
}
