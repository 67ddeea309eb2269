/* router_ref.c - plain-C reference of the router logits (router.h): fp32, in index order. */
#include "router.h"

void rw_k_router_ref(const float *x, const uint16_t *w, int64_t n, int64_t E, int64_t H, float *y) {
    for (int64_t t = 0; t < n; t++)
        for (int64_t e = 0; e < E; e++) {
            float s = 0.0f;
            for (int64_t i = 0; i < H; i++)
                s += x[t * H + i] * rw_bf16_to_f32(w[e * H + i]);
            y[t * E + e] = s;
        }
}

int64_t rw_k_router_counters(int64_t max_n) {
    return max_n > 0 ? (max_n + RW_K_ROUTER_GROUP - 1) / RW_K_ROUTER_GROUP : 1;
}
