/* Counter-based random numbers: Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel
 * random numbers: as easy as 1, 2, 3", SC 2011).
 *
 * A counter-based generator has no state that advances: every number is a pure
 * function of (key, counter). Lumen keys it with a request's 64-bit seed and counts
 * with the index of the generated token (the "step"), so the uniform used to draw
 * token i of a request depends only on (seed, i) — not on how many other requests
 * run beside it, how they are batched, or how often a token was re-sampled (the same
 * step always gives the same number). This is what makes "same seed, same text" hold
 * in a continuously batched engine.
 *
 * Block layout: counter = {step low 32 bits, step high 32 bits, lane, 0}, key = {seed
 * low, seed high}. Lane 0 is the sampler's token draw; other lanes are free for
 * callers that need more independent numbers per step (e.g. the accept/reject test of
 * speculative sampling) without disturbing lane 0.
 *
 * Thread safety: every function is pure. */
#ifndef LM_SAMPLING_RNG_H
#define LM_SAMPLING_RNG_H

#include <stdint.h>

/* The Philox4x32 bijection with 10 rounds: out = Philox(ctr) under key. */
void lm_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* 64 random bits for (seed, step, lane): words 0 and 1 of the Philox block. */
uint64_t lm_rng_u64(uint64_t seed, uint64_t step, uint32_t lane);

/* A uniform double in [0, 1) with 53 random bits: (lm_rng_u64(...) >> 11) * 2^-53. */
double lm_rng_uniform(uint64_t seed, uint64_t step, uint32_t lane);

#endif
