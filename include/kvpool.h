/*
 * kvpool.h - client library for the kvpool KV-cache daemon (kvpoold).
 *
 * An inference worker opens a client (one Unix-socket connection to the daemon), registers its KV
 * layout as an "instance", then stores and retrieves fixed-size KV chunks keyed by the token ids
 * of the sequence prefix. Two transports move the bytes:
 *
 *   - shm:    the daemon's L1 pool is a shared-memory segment that the library maps. Stores and
 *             retrieves are two-phase: prepare returns slots (pointers into the pool), the worker
 *             copies its KV straight into / out of them, then commits. One copy.
 *   - inline: the bytes travel over the socket. Used when the daemon has no segment (for
 *             example /dev/shm too small) or this process cannot map it. The library tells the
 *             daemon which transport it really uses, so the daemon's log never lies.
 *
 * The high-level calls kvp_store() and kvp_retrieve() work the same on both transports.
 *
 * Conventions (as libuv / liburing):
 *   - Every fallible call returns 0 (or a non-negative count) on success and a negative errno on
 *     failure. errno is never used to report errors. kvp_strerror() names any return code.
 *   - After a failure that the daemon answered, kvp_last_error() holds the daemon's message;
 *     after a failure detected by the library, its own explanation.
 *   - Daemon restarts. A call that fails with an I/O error (-EPIPE, -ECONNRESET, -ETIMEDOUT,
 *     ...) has lost the connection, and everything it held (reservations, pins, registrations)
 *     is released by the daemon. Nothing is retried behind the caller's back. The next call on
 *     the client reconnects first: it connects to the same socket path, says HELLO, registers
 *     every live instance again with the options it was registered with (mapping the new
 *     daemon's segment, or falling back to inline as kvp_register() does), then does its own
 *     work. A daemon that exited between two calls is noticed before anything is sent, so a
 *     restart while the worker is idle fails no call at all. The kvp_client and kvp_instance
 *     handles stay valid; kvp_instance_get_info() may then show another transport (and shm
 *     name, reason), never another chunk layout. One attempt per call, no background thread,
 *     no sleeping: while no daemon answers, each call fails with the connect error (-ENOENT,
 *     -ECONNREFUSED, ...; kvp_last_error() names the socket) and the next call tries again.
 *   - An instance that the new daemon refuses to register again (-EEXIST, -EBUSY, KVP_ENOSHM,
 *     ...) fails its own calls with that error and message, trying again once per call; the
 *     client's other instances go on. If the new daemon uses another chunk size, the instance
 *     is stale: its calls fail with -ESTALE until it is unregistered (register it again and size
 *     the buffers by the new chunk_bytes).
 *   - Plans belong to the connection they were prepared on. Once it is lost, kvp_commit_store(),
 *     kvp_abort_store(), kvp_store_inline() and kvp_commit_retrieve() of the plan fail with
 *     -ESTALE without contacting the daemon, free plan->slots and publish nothing. Until then
 *     the plan's slot pointers stay safe to touch but no longer reach any pool: what was
 *     written or read through them after the loss is lost. kvp_store() and kvp_retrieve() can
 *     return -ESTALE too, when another thread's call replaced the connection during theirs.
 *   - A protocol error (KVP_EPROTO, KVP_EVERSION, KVP_EBADSLOT, -EPROTO: the peer does not speak
 *     this protocol properly) is final: no reconnect, every later call on the client returns
 *     -ENOTCONN at once. Close it and open a new client.
 *   - Handles are opaque. Destructors accept NULL.
 *   - The library never prints and never calls exit().
 *   - A kvp_client may be shared between threads: calls on one client are serialised by a mutex.
 *     Open one client per thread for parallel transfers.
 */
#ifndef KVPOOL_H
#define KVPOOL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KVP_BUILDING_LIBRARY)
#define KVP_EXPORT __attribute__((visibility("default")))
#else
#define KVP_EXPORT
#endif

/* Library version: KVP_VERSION_MAJOR, _MINOR, _PATCH and _STRING, generated from the build's
 * project version. The major number changes when the ABI breaks. */
#include "kvpool_version.h"

/* Returns the runtime library version as (major << 16) | (minor << 8) | patch. */
KVP_EXPORT uint32_t kvp_version(void);

/*
 * Project-specific error codes, all negative and outside the errno range. Plain negative errno
 * values (-EINVAL, -ENOSPC, -ECONNREFUSED, ...) are used for everything else.
 */
#define KVP_ERRNO_MAP(XX)                                                      \
    XX(PROTO, -10001, "protocol error: malformed or unexpected frame")         \
    XX(VERSION, -10002, "protocol version mismatch between client and daemon") \
    XX(BADSLOT, -10003, "daemon sent a slot outside the mapped pool")          \
    XX(NOSHM, -10004, "shared-memory transport is not available")              \
    XX(PEER, -10005, "the daemon runs as a user this process does not trust")  \
    XX(PIPELINED, -10006, "an earlier commit sent without waiting failed; this call did nothing")

typedef enum {
#define KVP_ERRNO_ENUM(name, val, msg) KVP_E##name = (val),
    KVP_ERRNO_MAP(KVP_ERRNO_ENUM)
#undef KVP_ERRNO_ENUM
} kvp_errno_t;

/* Describes a return code: kvpool codes, negative errno values, or 0. Never returns NULL;
 * thread-safe. */
KVP_EXPORT const char *kvp_strerror(int err);

/* The symbolic name of a return code: "KVP_EPROTO" for kvpool's codes (KVP_ERRNO_MAP), "EINVAL"
 * and so on for negative errno values, "OK" for 0 or more, "E<n>" for an unknown code. Never
 * returns NULL; thread-safe. */
KVP_EXPORT const char *kvp_err_name(int err);

/* ---------------------------------------------------------------------------------------- */
/* Client connection                                                                        */

typedef struct kvp_client kvp_client;

typedef struct kvp_opts {
    /* Unix socket of the daemon. NULL: $KVPOOL_SOCKET, else kvp_default_socket_path(). */
    const char *socket_path;
    /* Per-request I/O timeout in milliseconds. 0: 30000. */
    uint32_t timeout_ms;
    /*
     * A uid the daemon may run as besides this process's own uid and root (which are always
     * trusted); 0: none. $KVPOOL_TRUST_UID (a comma-separated list of uids) adds more. The
     * library checks the daemon's credentials (SO_PEERCRED) on every connection, so that a
     * socket planted by another user never receives this process's KV.
     */
    uint32_t trust_uid;
    /* KVP_OPT_* bits; 0: the defaults. Unknown bits: kvp_client_open() returns -EINVAL. */
    uint32_t flags;
    /* Room for later options: must be zero (kvp_client_open() returns -EINVAL otherwise), so
     * that a field added here in a later minor version is never misread. */
    uint32_t reserved_[7];
} kvp_opts;

/*
 * Wait for the daemon's answer to every commit. By default a commit on the shm transport
 * (kvp_commit_store(), kvp_commit_retrieve(), and the ones inside kvp_store() and
 * kvp_retrieve()) is pipelined: it is sent and the call returns at once, so that a transfer
 * costs one round trip (the prepare) instead of two. The commit is still applied in order,
 * before any later request of the same client, and only after the copy, so nothing
 * half-written is ever visible; if it fails (say the reservation expired, -ETIMEDOUT), the
 * client's next call that talks to the daemon is not performed and returns KVP_EPIPELINED,
 * with kvp_last_error() naming the commit and its error (a later commit is still applied). A
 * pipelined kvp_commit_store() returns the number of chunks it sent for commit. With this flag,
 * or against a daemon older than protocol 1.2, every commit waits for its answer and returns
 * its own error.
 */
#define KVP_OPT_SYNC_COMMIT 0x1u

/*
 * Writes the default socket path into buf (NUL-terminated): $XDG_RUNTIME_DIR/kvpool/kvpool.sock
 * when XDG_RUNTIME_DIR is set, else /tmp/kvpool-<uid>/kvpool.sock. Returns the length, or
 * -ENAMETOOLONG. The daemon uses the same rule and creates the directory with mode 0700. Before
 * connecting to the default path, the library checks that its directory belongs to this
 * process's uid and is writable by nobody else (else kvp_client_open() fails with -EPERM).
 */
KVP_EXPORT int kvp_default_socket_path(char *buf, size_t size);

/*
 * Connects to the daemon and checks protocol versions. opts may be NULL (all defaults). The
 * socket path is resolved here once: reconnects (see Conventions) use the same path and
 * timeout. On success *ret is a new client; the caller frees it with kvp_client_close().
 * Returns 0, -ENOENT / -ECONNREFUSED when no daemon listens, -ETIMEDOUT, KVP_EVERSION,
 * KVP_EPROTO (the peer is not a kvpool daemon), -ENAMETOOLONG (socket path too long), -EPERM
 * (the default socket's directory belongs to another user or is writable by others), KVP_EPEER
 * (the process listening runs as a uid that is neither ours, root, opts->trust_uid nor in
 * $KVPOOL_TRUST_UID), -EINVAL (a malformed $KVPOOL_TRUST_UID, an unknown bit in opts->flags, or
 * a $KVPOOL_POLL_US that is not microseconds from 0 to 10000: how long a call yields its CPU
 * for a reply before sleeping, default 50, 0 never).
 */
KVP_EXPORT int kvp_client_open(const kvp_opts *opts, kvp_client **ret);

/* Closes the connection. The daemon releases every reservation and pin the client held and
 * unregisters its instances. Instances of this client must not be used afterwards. NULL is ok. */
KVP_EXPORT void kvp_client_close(kvp_client *c);

/* The daemon's message, or the library's explanation, for the last call on this client if it
 * failed ("" after a call that talked to the daemon and succeeded). Valid until the next call
 * on the client. With c == NULL: why the calling thread's last failed kvp_client_open() failed
 * (it returns no handle to ask), valid until that thread's next failed open. */
KVP_EXPORT const char *kvp_last_error(const kvp_client *c);

/* Round trip to the daemon. Returns 0 or a negative error. */
KVP_EXPORT int kvp_ping(kvp_client *c);

/* One daemon statistic (counter or gauge). */
typedef struct kvp_stat {
    char name[48];
    uint64_t value;
} kvp_stat;

/*
 * Fetches the daemon's statistics into out[0..cap). Returns the number of statistics the daemon
 * has (which may exceed cap: only the first cap are written), or a negative error.
 */
KVP_EXPORT int kvp_stats(kvp_client *c, kvp_stat *out, size_t cap);

/* ---------------------------------------------------------------------------------------- */
/* Administration: what the `kvpool` command line shows and does                            */

/*
 * Fetches the daemon's status as one JSON document: its version, state and uptime, the pool,
 * the shared-memory decision (or why it is off), every registered instance with its transport
 * (and why it is inline), the connected clients, every counter and gauge, and the request
 * latencies. It is the document GET /api/status serves (docs/HTTP.md lists the fields), here
 * over the daemon's socket, so it needs no HTTP endpoint. On success *json_out is a
 * NUL-terminated string that the caller frees with kvp_free(), and the return value is its
 * length in bytes. On failure *json_out is NULL and the return value is -EINVAL (c or json_out
 * NULL), -EOPNOTSUPP (the daemon speaks protocol 1.0, which has no status request; nothing was
 * sent and the connection stays usable), -ENOMEM, or another negative error.
 */
KVP_EXPORT int kvp_get_status(kvp_client *c, char **json_out);

/*
 * Fetches the daemon's metrics in the Prometheus text exposition format 0.0.4 (the kvpool_*
 * families of GET /metrics). Same contract as kvp_get_status(): *text_out is freed with
 * kvp_free(); the return value is its length or a negative error.
 */
KVP_EXPORT int kvp_get_metrics(kvp_client *c, char **text_out);

/*
 * Empties the cache: the daemon drops every committed chunk that no retrieve pins, of every
 * instance and client. Chunks pinned by a retrieve in progress stay (and stay cached), and so
 * do the reservations of stores in progress, which can still be committed. An L2 tier keeps its
 * copies. Returns the number of chunks dropped, -EOPNOTSUPP (a protocol 1.0 daemon; nothing
 * sent), or another negative error.
 */
KVP_EXPORT int kvp_clear(kvp_client *c);

/* Frees a string the library returned (kvp_get_status(), kvp_get_metrics()). NULL is ok. */
KVP_EXPORT void kvp_free(void *p);

/* ---------------------------------------------------------------------------------------- */
/* Instances (one per worker / tensor-parallel rank)                                        */

typedef struct kvp_instance kvp_instance;

typedef enum {
    KVP_TRANSPORT_AUTO = 0,   /* shm when possible, else inline */
    KVP_TRANSPORT_SHM = 1,    /* shm or fail with KVP_ENOSHM */
    KVP_TRANSPORT_INLINE = 2, /* always inline */
} kvp_transport;

typedef struct kvp_register_opts {
    const char *instance_id; /* unique per worker, 1..127 bytes, e.g. "vllm-rank0-pid4242" */
    const char *model_name;  /* 1..127 bytes */
    uint32_t world_size;     /* tensor-parallel world size, >= 1 */
    uint32_t worker_rank;    /* < world_size */
    uint32_t block_size;     /* tokens per paged-KV block of the engine, >= 1 */
    uint32_t num_layers;     /* >= 1 */
    uint32_t hidden_dim;     /* heads * head_size (or the MLA latent size), >= 1 */
    const char *dtype;       /* "float16", "bfloat16", "float32", "float64", "int8", "uint8",
                                "float8_e4m3fn", "float8_e5m2" */
    uint32_t use_mla;        /* non-zero: MLA layout [layers, chunk, hidden], shared by ranks */
    uint32_t transport;      /* a kvp_transport */
    uint32_t reserved_[8];   /* room for later options: must be zero (else -EINVAL) */
} kvp_register_opts;

/* What the daemon answered to a registration. */
typedef struct kvp_instance_info {
    uint32_t transport;    /* KVP_TRANSPORT_SHM or KVP_TRANSPORT_INLINE: the one in use */
    uint32_t chunk_tokens; /* tokens per chunk (the daemon's --chunk-size) */
    uint32_t ndim;         /* 3 (MLA) or 4 */
    uint32_t shape[4];     /* [2, layers, chunk, hidden] or [layers, chunk, hidden] */
    uint64_t chunk_bytes;  /* bytes of one chunk */
    uint32_t dtype_size;   /* bytes per element */
    uint32_t existing;     /* non-zero: this client had registered the id already */
    char dtype[24];
    char shm_name[128]; /* segment name when transport is shm, else "" */
    char reason[256];   /* why inline was chosen, else "" */
} kvp_instance_info;

/*
 * Registers a KV layout. In auto mode the library maps the daemon's segment if it is offered and
 * falls back to inline if that fails, telling the daemon why. On success *ret is the instance,
 * freed by kvp_unregister() or with its client. An instance id names one registration of one
 * client: registering it again on the same client returns that registration (info.existing);
 * while another client holds it, the call fails. Returns 0, -EINVAL (the daemon's message names
 * the field), -EEXIST (the id is registered with another model, world size, rank or layout; the
 * message names the field and both values), -EBUSY (the id is registered identically by another
 * live client; the message names its pid), KVP_ENOSHM (transport SHM requested but
 * unavailable), or another negative error. kvp_last_error() holds the daemon's message. The
 * library keeps a copy of opts (the strings need not outlive the call): after a daemon restart
 * it registers the instance again with them.
 */
KVP_EXPORT int kvp_register(kvp_client *c, const kvp_register_opts *opts, kvp_instance **ret);

/* Unregisters and frees the instance: the daemon aborts its reservations and releases its pins.
 * Pointers into the pool obtained through it become invalid. NULL is ok (returns 0). If the
 * connection the instance was registered on is lost, nothing is sent and 0 is returned: that
 * registration is gone with it, and no reconnect makes it again. */
KVP_EXPORT int kvp_unregister(kvp_instance *inst);

/* Registration details (pointer valid while the instance lives). */
KVP_EXPORT const kvp_instance_info *kvp_instance_get_info(const kvp_instance *inst);

/* ---------------------------------------------------------------------------------------- */
/* Keys                                                                                     */

/*
 * A sequence: its token ids from the start, and an optional cache salt that isolates tenants.
 * Only full chunks are cached: chunk i covers tokens [i*chunk_tokens, (i+1)*chunk_tokens).
 * Limits: count <= 1048576 tokens, salt_len <= 256 bytes.
 */
typedef struct kvp_tokens {
    const uint32_t *ids;
    uint32_t count;
    uint32_t salt_len;
    const void *salt;
} kvp_tokens;

/* Number of leading full chunks of the sequence that are cached, or a negative error. */
KVP_EXPORT int kvp_lookup(kvp_instance *inst, const kvp_tokens *seq);

/*
 * Number of full chunks in tokens [start, end) of a sequence of ntokens tokens, by the rule every
 * ranged call applies (and the daemon too): start is a multiple of chunk_tokens, start <= end <=
 * ntokens, end is rounded down to a chunk boundary, at most 4096 chunks. For sizing buffers
 * before kvp_retrieve() or kvp_store(); no round trip to the daemon. Returns the count (0 is
 * fine), -EINVAL or -E2BIG; kvp_last_error() then names the rule and the values.
 */
KVP_EXPORT int kvp_chunk_count(kvp_instance *inst, uint32_t start, uint32_t end, uint32_t ntokens);

/* ---------------------------------------------------------------------------------------- */
/* Two-phase store and retrieve (zero copy on the shm transport)                            */

typedef struct kvp_slot {
    uint32_t chunk_index; /* chunk of the request range, 0 = the chunk at token `start` */
    uint32_t reserved_;   /* the library's (the connection the plan belongs to): do not change */
    uint64_t offset;      /* byte offset in the shared segment (shm) */
    uint64_t length;      /* equals chunk_bytes */
    void *data;           /* shm: pointer into the mapped pool; inline: NULL */
} kvp_slot;

/* Outcome of a prepare-store, filled by kvp_prepare_store(). */
typedef struct kvp_store_plan {
    uint64_t reservation; /* daemon reservation id (0: nothing reserved) */
    uint32_t nchunks;     /* full chunks in [start, end) */
    uint32_t cached;      /* already cached: nothing to do */
    uint32_t busy;        /* being stored right now by another worker */
    uint32_t no_space;    /* could not be reserved: pool full of pinned/reserved data */
    uint32_t nslots;      /* reserved slots, in slots[] */
    kvp_slot *slots;      /* owned by the plan */
} kvp_store_plan;

/*
 * Reserves pool space for the chunks of tokens [start, end) that are not cached yet. start and
 * end are token offsets; start must be a multiple of chunk_tokens; end is rounded down to a chunk
 * boundary and must be <= seq->count. Fills *plan (release it with kvp_commit_store(),
 * kvp_abort_store() or kvp_store_inline(); each frees plan->slots). Returns the number of
 * reserved slots (0 when all chunks are cached or busy; see plan->no_space), or a negative
 * error. On the shm transport each slot's data points into the pool: write chunk_bytes there.
 */
KVP_EXPORT int kvp_prepare_store(kvp_instance *inst, const kvp_tokens *seq, uint32_t start,
                                 uint32_t end, kvp_store_plan *plan);

/* Publishes the reserved chunks (shm transport: after writing every slot). Frees plan->slots.
 * Returns the number of chunks committed, or a negative error (-ETIMEDOUT: the reservation
 * expired and nothing was published; -EOPNOTSUPP: the instance is on the inline transport,
 * use kvp_store_inline(); the reservation is dropped; -ESTALE: the plan was prepared on a
 * connection that has been lost since, e.g. the daemon restarted: nothing was published and
 * nothing was sent, prepare again). */
KVP_EXPORT int kvp_commit_store(kvp_instance *inst, kvp_store_plan *plan);

/* Drops the reservation: nothing becomes visible. Frees plan->slots. Returns 0 or an error
 * (-ESTALE: the plan's connection was lost, and its reservation with it). */
KVP_EXPORT int kvp_abort_store(kvp_instance *inst, kvp_store_plan *plan);

/*
 * Inline transport: sends the bytes of every reserved slot and commits. chunks[i] is the data
 * of chunk i of the request range (as indexed by kvp_slot.chunk_index), chunk_bytes long; only
 * the reserved ones are read. Frees plan->slots. Returns chunks committed or a negative error.
 * Works on the shm transport too (the daemon copies). If chunks (or a chunks[i] that a slot
 * needs) is NULL it returns -EINVAL and leaves the plan untouched, so it can still be aborted.
 * -ESTALE: the plan was prepared on a connection that has been lost since; nothing was sent or
 * published, and the plan is freed.
 */
KVP_EXPORT int kvp_store_inline(kvp_instance *inst, kvp_store_plan *plan,
                                const void *const *chunks);

/* Outcome of a prepare-retrieve. */
typedef struct kvp_retrieve_plan {
    uint64_t pin;     /* daemon pin id (0: nothing pinned) */
    uint32_t nchunks; /* full chunks in [start, end) */
    uint32_t nslots;  /* leading cached chunks pinned, slots[i].chunk_index == i */
    kvp_slot *slots;  /* owned by the plan */
} kvp_retrieve_plan;

/*
 * shm transport: pins the leading run of cached chunks of [start, end) so that they cannot be
 * evicted, and returns read-only slots. Copy out, then kvp_commit_retrieve(). Returns the number
 * of pinned chunks, or a negative error (KVP_ENOSHM on the inline transport).
 */
KVP_EXPORT int kvp_prepare_retrieve(kvp_instance *inst, const kvp_tokens *seq, uint32_t start,
                                    uint32_t end, kvp_retrieve_plan *plan);

/* Releases the pins of a prepared retrieve. Frees plan->slots. Returns 0 or an error. Slot
 * pointers must not be used afterwards. -ESTALE: the plan's connection was lost (the pins went
 * with it), so what was copied out of the slots may not be the chunks: retrieve again. */
KVP_EXPORT int kvp_commit_retrieve(kvp_instance *inst, kvp_retrieve_plan *plan);

/* ---------------------------------------------------------------------------------------- */
/* One-call store and retrieve (any transport)                                              */

typedef struct kvp_store_result {
    uint32_t nchunks;  /* full chunks in the range */
    uint32_t stored;   /* newly stored */
    uint32_t cached;   /* were cached already */
    uint32_t busy;     /* being stored by someone else */
    uint32_t no_space; /* not stored: pool full of pinned/reserved data */
} kvp_store_result;

/*
 * Stores chunks[i] (chunk_bytes each) as chunk i of tokens [start, end). Skips cached chunks.
 * result may be NULL. Returns the number of chunks newly stored, or a negative error.
 */
KVP_EXPORT int kvp_store(kvp_instance *inst, const kvp_tokens *seq, uint32_t start, uint32_t end,
                         const void *const *chunks, kvp_store_result *result);

/*
 * Copies the leading run of cached chunks of [start, end) into out[i] (chunk_bytes each). Returns
 * the number of chunks retrieved (0..nchunks), or a negative error.
 */
KVP_EXPORT int kvp_retrieve(kvp_instance *inst, const kvp_tokens *seq, uint32_t start, uint32_t end,
                            void *const *out);

#ifdef __cplusplus
}
#endif

#endif /* KVPOOL_H */
