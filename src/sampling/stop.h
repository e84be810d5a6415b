/* Stop strings matched on the decoded text, as it streams.
 *
 * The generator feeds each detokenized piece; the matcher answers with the bytes that
 * may be shown now and holds back the rest:
 *   - any suffix of the text that is a proper prefix of some stop string (it could
 *     still become a match): at most (longest stop length - 1) bytes;
 *   - an incomplete UTF-8 character at the end of what could be emitted, so emitted
 *     text never splits a multi-byte character (at most 3 more bytes).
 * Held bytes are released as soon as they can no longer be part of a match, and all
 * of them at lm_stop_matcher_finish (end of stream: end token, length, cancel) —
 * nothing is lost, even an incomplete character.
 *
 * Which match wins (the integrator should know): the matcher stops at the first
 * byte of the text at which some stop string is complete — the match that ENDS
 * earliest — and, if several stop strings end at that byte, takes the longest (the
 * one starting earliest). The output is cut exactly before that match. Consequences:
 *   - the decision never needs bytes after the match, so generation stops as soon as
 *     a stop string appears, and the result depends only on the text, never on how
 *     it was split into pieces (streaming and non-streaming agree);
 *   - "earliest start" and "earliest end" differ only when one stop string occurs
 *     strictly inside another: with stops {"abc", "b"} on "abc", "b" ends first, so
 *     the output is "a" (an earliest-start rule would have waited for 'c' and given
 *     ""). With {"ab", "bc"} on "abc" the output is "" ("ab" ends first); with
 *     {"abc", "bc"} on "abc" both end at 'c' and "abc", the longer, wins: output "".
 *   - duplicate stop strings report the lowest index.
 * Stop strings are matched byte-wise (any bytes, NUL included, via explicit lengths).
 * With valid UTF-8 text and stop strings, every cut falls on a character boundary.
 *
 * Cost: an Aho-Corasick automaton over the stop strings; each text byte is processed
 * once (amortized O(1) transitions), and held bytes are at most max_len + 2, so a
 * stream costs O(text length + pieces * max_len) in total.
 *
 * Thread safety: a matcher is single-threaded state (one per request). */
#ifndef LM_SAMPLING_STOP_H
#define LM_SAMPLING_STOP_H

#include <stddef.h>
#include <stdint.h>

#include "lumen.h"

/* Limits on what a matcher accepts (LM_ERR_LIMIT beyond them). */
#define LM_STOP_MAX_STRINGS 1024
#define LM_STOP_MAX_TOTAL_BYTES (1u << 20)

typedef struct lm_stop_matcher lm_stop_matcher;

typedef struct lm_stop_output {
    const char *text; /* bytes that may be emitted now: borrowed from the matcher, valid
                         until its next call (feed, finish, reset, free); never NULL */
    size_t len;
    int32_t stop_index; /* -1: no stop string so far; >= 0: the index of the matched
                           stop string — `text` ends exactly before it, the stream is
                           over and later feeds emit nothing and repeat the index. To
                           include the stop string in the output (vLLM's
                           include_stop_str_in_output), append stops[stop_index]. */
} lm_stop_output;

/* A matcher for n_stops strings (n_stops may be 0: then it only holds back
 * incomplete UTF-8). lens may be NULL (then each stop is NUL-terminated) or give each
 * length. The strings are copied. LM_ERR_INVALID_ARG for a NULL or empty stop string;
 * LM_ERR_LIMIT beyond the limits above. */
lm_status lm_stop_matcher_create(const char *const *stops, const size_t *lens, size_t n_stops,
                                 lm_stop_matcher **out);
void lm_stop_matcher_free(lm_stop_matcher *m); /* NULL is a no-op */

/* Back to the start of a new stream (same stop strings). */
void lm_stop_matcher_reset(lm_stop_matcher *m);

/* Feeds the next piece of text (len may be 0; piece may be NULL when len is 0) and
 * says what may be emitted now. LM_ERR_INVALID_ARG after lm_stop_matcher_finish
 * (reset first); LM_ERR_NO_MEMORY if the piece cannot be buffered. */
lm_status lm_stop_matcher_feed(lm_stop_matcher *m, const char *piece, size_t len, lm_stop_output *out);

/* End of stream without (further) text: emits every held byte. After a match it
 * emits nothing and reports the match again. */
lm_status lm_stop_matcher_finish(lm_stop_matcher *m, lm_stop_output *out);

/* Bytes currently held back (not yet emitted). */
size_t lm_stop_matcher_held(const lm_stop_matcher *m);

#endif
