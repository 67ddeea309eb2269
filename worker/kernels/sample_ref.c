/* sample_ref.c - plain-C reference of the sampling kernel (sample.h): the fixed-point rule, one
 * request after the other; and the CPU side both sampling rules share (sampler.c uses it too). */
#include <math.h>
#include <stdlib.h>

#include "sample.h"

/* descending z, ties to the lower id */
int rw_sample_zid_cmp(const void *a, const void *b) {
    const rw_sample_zid *x = a, *y = b;
    if (x->z > y->z) return -1;
    if (x->z < y->z) return 1;
    return x->id < y->id ? -1 : (x->id > y->id);
}

int64_t rw_sample_sort_top_k(const float *logits, int64_t V, float inv_t, int top_k,
                             rw_sample_zid *s, float *thr) {
    for (int64_t i = 0; i < V; i++) {
        s[i].z = logits[i] * inv_t;
        s[i].id = (int32_t)i;
    }
    qsort(s, (size_t)V, sizeof *s, rw_sample_zid_cmp);
    int64_t nk = V;
    *thr = -INFINITY;
    if (top_k > 0 && top_k < V) {
        *thr = s[top_k - 1].z;
        while (nk > 0 && s[nk - 1].z < *thr)
            nk--; /* ties at the boundary stay */
    }
    return nk;
}

void rw_sample_top_n(const float *logits, int64_t V, int n, float lse, int32_t *ids, float *lps) {
    float pv = INFINITY;
    int32_t pid = -1;
    for (int j = 0; j < n; j++) {
        int32_t best = -1;
        for (int64_t i = 0; i < V; i++) {
            const float x = logits[i];
            if (x > pv || (x == pv && i <= pid)) continue;
            if (best < 0 || x > logits[best]) best = (int32_t)i;
        }
        if (best < 0) best = 0;
        ids[j] = best;
        lps[j] = logits[best] - lse;
        pv = logits[best];
        pid = best;
    }
}

static inline uint64_t fixed_mass(float z, float zmax) {
    return (uint64_t)((double)expf(z - zmax) * 4294967296.0);
}

size_t rw_k_sample_ws_bytes(int64_t n, int64_t V) {
    if (n <= 0 || V <= 0) return 0;
    const int64_t chunks = (V + RW_K_SAMPLE_CHUNK - 1) / RW_K_SAMPLE_CHUNK;
    return (size_t)n * (size_t)chunks * sizeof(rw_k_sample_part);
}

void rw_k_sample_ref(const float *logits, int64_t n, int64_t V, const rw_k_sample_param *p,
                     rw_k_sample_out *out) {
    rw_sample_zid *s = malloc(sizeof(rw_sample_zid) * (size_t)V);
    for (int64_t r = 0; r < n; r++) {
        const rw_k_sample_param *pr = &p[r];
        const float *l = logits + (int64_t)pr->row * V;
        rw_k_sample_out *o = &out[r];
        float mx = -INFINITY;
        int32_t arg = 0;
        for (int64_t i = 0; i < V; i++)
            if (l[i] > mx) {
                mx = l[i];
                arg = (int32_t)i;
            }
        float se = 0.0f;
        for (int64_t i = 0; i < V; i++)
            se += expf(l[i] - mx);
        const float lse = mx + logf(se);
        int32_t tok = pr->forced >= 0 ? pr->forced : arg;
        /* inv_t 0: greedy, also for a temperature too small to invert (sample.h) */
        const float inv_ts = rw_sample_inv_temperature(pr->temperature, pr->top_k, mx);
        const bool greedy = inv_ts == 0.0f || !s;
        const bool processed = pr->mode == 1;
        float inv_t = 1.0f, zmax = 0.0f, thr = -INFINITY, lkept = 0.0f;
        if (!greedy && (pr->forced < 0 || processed)) {
            inv_t = inv_ts;
            zmax = mx * inv_t;
            const int64_t nk = rw_sample_sort_top_k(l, V, inv_t, pr->top_k, s, &thr);
            if (pr->top_p < 1.0f) {
                uint64_t tot = 0;
                for (int64_t i = 0; i < nk; i++)
                    tot += fixed_mass(s[i].z, zmax);
                const uint64_t target = (uint64_t)((double)pr->top_p * (double)tot);
                uint64_t cum = 0;
                for (int64_t i = 0; i < nk; i++) {
                    cum += fixed_mass(s[i].z, zmax);
                    /* all entries equal to s[i].z belong to the kept set */
                    if (cum >= target && (i + 1 == nk || s[i + 1].z != s[i].z)) {
                        if (s[i].z > thr) thr = s[i].z;
                        break;
                    }
                }
            }
        }
        if (!greedy && pr->forced < 0) {
            uint64_t W = 0;
            for (int64_t i = 0; i < V; i++)
                if (l[i] * inv_t >= thr) W += fixed_mass(l[i] * inv_t, zmax);
            const uint64_t u =
                (uint64_t)(rw_sample_uniform_dev(pr->seed, pr->position) * 16777216.0f);
            const uint64_t target = (W >> 24) * u + (((W & 0xffffffu) * u) >> 24);
            uint64_t cum = 0;
            tok = -1;
            for (int64_t i = 0; i < V; i++) {
                const float z = l[i] * inv_t;
                if (z < thr) continue;
                const uint64_t w = fixed_mass(z, zmax);
                if (w == 0) continue;
                cum += w;
                tok = (int32_t)i;
                if (cum > target) break;
            }
            if (tok < 0) tok = arg;
        }
        if (processed && !greedy) {
            /* the kernel sums in a fixed tree; index order here: equal to rounding */
            float sk = 0.0f;
            for (int64_t i = 0; i < V; i++)
                if (l[i] * inv_t >= thr) sk += expf(l[i] * inv_t - zmax);
            lkept = logf(sk);
        }
#define LP_OF(id)                                                                                  \
    (!processed             ? l[id] - lse                                                          \
     : greedy               ? ((id) == arg ? 0.0f : -INFINITY)                                     \
     : l[id] * inv_t >= thr ? (l[id] * inv_t - zmax) - lkept                                       \
                            : -INFINITY)
        o->token = tok;
        o->logprob = LP_OF(tok);
        const int tn = pr->top_n < 20 ? pr->top_n : 20;
        rw_sample_top_n(l, V, tn, lse, o->top_ids, o->top_lps);
        for (int j = 0; j < tn; j++)
            o->top_lps[j] = LP_OF(o->top_ids[j]);
#undef LP_OF
    }
    free(s);
}
