/*
 * response_store.h - the in-memory store of OpenAI Responses API results (POST /v1/responses
 * with "store": true), for previous_response_id, item_reference input items and
 * GET/DELETE /v1/responses/{id}.
 *
 * Each entry holds a response's JSON (the body GET returns), the conversation it ended (chat
 * messages in the chat template's shape, its output included, the request's instructions
 * left out, as OpenAI does not carry instructions over), and the ids of its output items.
 * An entry expires ttl seconds after it was stored (OpenAI keeps responses for a fixed
 * time, not from the last use). The entries' bytes (their strings plus a fixed overhead)
 * stay at most max_bytes: storing past the cap evicts the least recently used entries
 * (stored, read or continued longest ago) first. An entry larger than the whole cap is not
 * stored. Thread-safe (one mutex). Times are caller-supplied seconds on a monotonic clock,
 * so tests can move time.
 */
#ifndef KILN_SERVER_RESPONSE_STORE_H
#define KILN_SERVER_RESPONSE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct srv_rstore srv_rstore;

/** Fixed bytes counted per entry on top of its strings (the entry record, the list links). */
#define SRV_RSTORE_ENTRY_OVERHEAD 128

/** A store of at most max_bytes (0: store nothing) whose entries live ttl_s seconds (> 0).
 *  NULL on allocation failure. */
srv_rstore *srv_rstore_create(size_t max_bytes, double ttl_s);
/** Free every entry. NULL is a no-op. */
void srv_rstore_destroy(srv_rstore *s);

/**
 * Store a response under id (replacing an entry of the same id): response_json and
 * messages_json are copied; item_ids[0..n_items) are the ids of its output items. Expired
 * entries are dropped first, then least recently used ones until the new entry fits.
 * Returns false (nothing stored) when the entry alone exceeds max_bytes or memory runs out.
 */
bool srv_rstore_put(srv_rstore *s, const char *id, const char *response_json,
                    const char *messages_json, const char *const *item_ids, int n_items,
                    double now_s);

/** Which string of an entry srv_rstore_get copies. */
typedef enum srv_rstore_part { SRV_RSTORE_RESPONSE = 0, SRV_RSTORE_MESSAGES = 1 } srv_rstore_part;

/**
 * A malloc'd copy of one string of the live entry id, or NULL when there is none (never
 * stored, evicted, deleted, or expired: expired entries are dropped here). A hit makes the
 * entry the most recently used.
 */
char *srv_rstore_get(srv_rstore *s, const char *id, srv_rstore_part part, double now_s);

/** The response JSON (malloc'd copy) of the live entry that has an output item item_id;
 *  NULL when none has. A hit makes the entry the most recently used. */
char *srv_rstore_find_item(srv_rstore *s, const char *item_id, double now_s);

/** Remove the live entry id. False when there is none. */
bool srv_rstore_delete(srv_rstore *s, const char *id, double now_s);

/** Live entries and their bytes (expired ones not yet dropped are counted). */
void srv_rstore_stats(srv_rstore *s, int64_t *n_entries, size_t *bytes);

#endif
