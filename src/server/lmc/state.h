/*
 * state.h - the LMCache front end's state, shared by the modules that give LMCache's semantics
 * (docs/LMCACHE.md, "Semantics"): instances and their liveness (instances.h), pending
 * prepare/commit pairs (pending.h), store and retrieve (transfers.h), the in-band transports
 * (inband.h), prefetch jobs and lookup read locks (jobs.h). Private to those modules and to the
 * handlers that encode their answers; it includes none of them, so that they can call each other
 * without an include cycle.
 *
 * Threads: everything here belongs to the listener's thread (front.h), except the events of an
 * instance (struct lmc_inst.events, struct lmc_state.events_pending), which its owner's callbacks
 * set from any thread (instances.c).
 */
#ifndef KVP_LMC_STATE_H
#define KVP_LMC_STATE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/limits.h"
#include "core/ops.h"
#include "core/owner.h"
#include "lmc/envelope.h"
#include "lmc/front.h"
#include "lmc/messages.h"
#include "lmc/torch_pickle.h"

#define LMC_MAX_INSTANCES 1024u
#define LMC_MAX_PENDING 64u
#define LMC_MAX_JOBS 4096u
#define LMC_MAX_REAPED 256u
/* Unclaimed lookup read locks are dropped after LMCache's read TTL. */
#define LMC_READ_TTL_MS (300u * 1000u)
#define LMC_JOB_BUCKETS 1024u

/* A prepare whose commit has not come yet (pending.h). */
struct lmc_pending {
    uint64_t hold;      /* the core's reservation or pin-set id */
    uint8_t digest[16]; /* the key's identity */
    uint64_t peer;      /* the connection that prepared it: only it commits (lmc_front.peer) */
    bool read;          /* a prepare_retrieve's pins, else a prepare_store's reservation */
};

/* What another thread tells an instance through its owner's callbacks (instances.c). */
enum lmc_inst_event {
    LMC_EV_SHM_LOST = 1u << 0, /* the shared segment is lost: drop it, its worker re-registers */
    LMC_EV_DROP = 1u << 1,     /* the daemon ends it */
};

/* One LMCache instance: a worker rank, named by its 63-bit instance id. */
struct lmc_inst {
    uint64_t iid;
    struct lmc_state *st; /* its front end's state (fixed: the callbacks read it) */
    bool registered;      /* owner and core registration exist */
    bool refused;
    char refusal[640];
    struct kvp_owner owner;
    uint32_t handle;           /* its core registration */
    struct lmc_register asked; /* what the worker sent, to compare a re-registration */
    /*
     * The transport of its registration (enum kvp_reg_transport) as the registry gave it to
     * this thread: at registration, at each re-registration, and when this front end moved it
     * off shared memory (kvp_op_leave_shm()). The registry changes an LMCache registration's
     * transport only at this front end's request; the daemon-wide loss of the segment comes as
     * the owner's shm_lost event, which ends the instance. It is kept rather than asked of the
     * registry per request because every prepare and commit needs it, on the one thread that
     * serves all LMCache workers, and asking costs the registry's lock and the copy of a whole
     * registration (kvp_op_instance()) on top of the one the operation itself makes.
     */
    uint8_t transport;
    /* Its chunk's shape and dtype, as every slot of its replies carries them: fixed for the
     * registration's life (dtype points into asked or to a static name). */
    struct lmc_slot_shape shape;
    bool tpl_ok;         /* tpl and exp describe its chunk */
    bool etpl_ok;        /* etpl and eexp too */
    uint32_t max_chunks; /* chunks one in-band commit may carry (what the pool holds) */
    struct kvp_tpickle_expect exp;
    struct kvp_tpickle_template tpl;
    struct kvp_envelope_expect eexp;
    struct kvp_envelope_template etpl;
    int32_t rank;  /* the worker_id of its requests, -1 before the first */
    uint64_t peer; /* the connection that registered it last (--max-instances-per-client) */
    uint64_t last_seen_ms;
    bool pinged;
    /* enum lmc_inst_event bits, set by its owner's callbacks on any thread, taken (exchanged
     * to 0) by the listener's thread. */
    atomic_uint events;
    struct lmc_pending pend[LMC_MAX_PENDING];
    uint32_t npend;
};

/* One rank's lookup read locks of a job. */
struct lmc_job_pin {
    uint64_t iid;    /* the instance whose owner holds them */
    uint32_t handle; /* its registration then (a new one has another handle) */
    uint64_t hold;   /* the pin set; 0 when the lookup found nothing in L1 */
    uint32_t rank;
    uint32_t readers_left;
};

/* A prefetch job: one lookup of a request id (jobs.h). */
struct lmc_job {
    char rid[LMC_MAX_REQUEST_ID + 1];
    uint64_t hash;
    uint32_t hits;
    bool consumed;
    uint64_t created_ms;
    uint32_t npins;
    struct lmc_job_pin *pins;
    struct lmc_job *hnext;         /* bucket chain */
    struct lmc_job *older, *newer; /* age list (sentinel: lmc_state.jobs) */
};

/* What the front end remembers of an instance id it no longer has, for the id's pings. */
enum lmc_gone_kind {
    LMC_GONE_REAPED,       /* reaped or dropped by kvpoold: its next ping is answered false ... */
    LMC_GONE_TOLD,         /* ... and the ones after that true */
    LMC_GONE_UNREGISTERED, /* unregistered by its worker: its pings are answered true */
};

struct lmc_gone {
    uint64_t iid;
    uint8_t kind; /* enum lmc_gone_kind */
};

/* What a prepare answers (transfers.h fills it, the handlers encode it). */
struct lmc_slots {
    uint32_t n;
    struct lmc_slot *slots; /* LMC state scratch: valid until the next request */
    uint32_t *chunk_indices;
    struct lmc_slot_shape shape;
    bool no_buffers; /* prepare_store: answer {} (an in-band instance) */
    /* prepare_retrieve of an in-band instance: the chunks to encode (n of them, pinned until
     * lmc_retrieve_in_band_end()) in a tensor envelope (envelope: etpl) or a pickle (tpl). */
    bool in_band;
    bool envelope;
    const uint8_t *const *chunks;
    const struct kvp_tpickle_template *tpl;
    const struct kvp_envelope_template *etpl;
};

struct lmc_state {
    struct lmc_inst *inst[LMC_MAX_INSTANCES];
    uint32_t ninst;
    /* Set (release) by an owner's callback after it set an instance's events: the listener's
     * thread then looks at the instances' events (acquire). */
    atomic_bool events_pending;
    uint64_t next_reap_ms; /* no instance can be due before (instances.c) */
    struct lmc_job *buckets[LMC_JOB_BUCKETS];
    struct lmc_job jobs; /* age list sentinel: jobs.newer is the oldest */
    uint32_t njobs;
    struct lmc_gone gone[LMC_MAX_REAPED];
    uint32_t gone_next;
    struct lmc_slot slots[KVP_MAX_CHUNKS];
    uint32_t idx[KVP_MAX_CHUNKS];
    struct kvp_tpickle_tensor tens[KVP_MAX_CHUNKS];   /* a pickle commit's chunks in its frame */
    struct kvp_envelope_tensor etens[KVP_MAX_CHUNKS]; /* an envelope commit's */
    const uint8_t *src[KVP_MAX_CHUNKS];               /* either, in range order */
    const uint8_t *chunks[KVP_MAX_CHUNKS];            /* an in-band retrieve's chunks in the pool */
    struct lmc_inst *rin;                             /* whose in-band retrieve is pinned ... */
    struct kvp_op_slots rres;                         /* ... and what it pinned */
    char msg[KVP_MAX_ERRMSG + 1];
};

/* The instance of id iid in the table (registered, refused or being dropped), or NULL. */
struct lmc_inst *lmc_inst_find(struct lmc_state *st, uint64_t iid);

/* The core's key source of key k (its tokens in f->tokens) for rank; lookup: the tokens up to
 * the key's end only, as LMCache hashes a lookup. */
void lmc_key_src(const struct lmc_front *f, const struct lmc_key *k, uint32_t rank, bool lookup,
                 struct kvp_key_src *src);

/* Records what the request being served came to (printf-style), while DEBUG is logged: the
 * listener's DEBUG line of the request shows it (f->outcome). */
void lmc_outcome(struct lmc_front *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* KVP_LMC_STATE_H */
