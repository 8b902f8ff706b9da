/* cachet/cachet.h: the C ABI over cachet::CachingAllocator (one allocator per device).
 *
 * Nothing here aborts or throws: every call that can fail returns a cachet_status and leaves
 * the message in cachet_last_error() (per thread). Strings returned by cachet_*_json are
 * malloc'd; release them with cachet_string_free. */
#ifndef CACHET_CACHET_H
#define CACHET_CACHET_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cachet_allocator cachet_allocator;

typedef enum cachet_status {
  CACHET_OK = 0,
  CACHET_ERR_OUT_OF_MEMORY = 1, /* PyTorch's "CUDA out of memory. ..." message */
  CACHET_ERR_USAGE = 2,         /* bad pointer, double free, foreign stream, bad fraction, ... */
  CACHET_ERR_DEVICE = 3,        /* a CUDA call failed (or CUDA is unavailable) */
  CACHET_ERR_CONFIG = 4,        /* the configuration string was rejected */
  CACHET_ERR_INTERNAL = 5       /* anything else (including validate-mode violations) */
} cachet_status;

/* An allocator for CUDA device `device` with configuration `config` (PyTorch syntax plus
 * cachet's keys; NULL or "" = defaults, "env" = from CACHET_ALLOC_CONF /
 * PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF). NULL on error (see cachet_last_error). */
cachet_allocator* cachet_create(int device, const char* config);
/* The same over the host simulation backend (no GPU): `capacity` bytes of synthetic memory. */
cachet_allocator* cachet_create_host(uint64_t capacity, const char* config);
void cachet_destroy(cachet_allocator* a);

/* size 0 gives *out = NULL and CACHET_OK. `stream` is the raw cudaStream_t value. */
cachet_status cachet_allocate(cachet_allocator* a, size_t size, uint64_t stream, void** out);
cachet_status cachet_free(cachet_allocator* a, void* ptr);
cachet_status cachet_record_stream(cachet_allocator* a, void* ptr, uint64_t stream);
cachet_status cachet_empty_cache(cachet_allocator* a);
cachet_status cachet_set_memory_fraction(cachet_allocator* a, double fraction);

/* Sleep and wake (docs/sleep-wake.md; the allocator needs cachet_sleep:True in its config).
 * Tag lists are arrays of `n` C strings; n = 0 names every tag (`tags`) or none (`backup_tags`).
 * cachet_set_tag sets the calling thread's current tag (every later allocation of the thread
 * carries it; "default" at first). cachet_sleep gives back the memory of the named tags' segments
 * (and of every free cached one), backing up the contents of `backup_tags`' blocks to pinned host
 * memory; *bytes_out (if not NULL) receives the bytes given back. cachet_wake maps the memory
 * again at the same addresses and restores the backups; CACHET_ERR_OUT_OF_MEMORY leaves
 * everything asleep with its backups. */
cachet_status cachet_set_tag(const char* tag);
cachet_status cachet_sleep(cachet_allocator* a, const char* const* tags, size_t n_tags, const char* const* backup_tags,
                           size_t n_backup_tags, uint64_t* bytes_out);
cachet_status cachet_wake(cachet_allocator* a, const char* const* tags, size_t n_tags);
/* The tags with sleeping blocks (a JSON list of strings), and the 21 sleep.* stats (a flat dict).
 * NULL on error. */
char* cachet_sleeping_json(cachet_allocator* a);
char* cachet_sleep_stats_json(cachet_allocator* a);
/* Gives back the pinned host buffers kept between sleeps (none that holds a backup; empty_cache
 * keeps them); *bytes_out (if not NULL) receives their bytes. */
cachet_status cachet_release_backup_buffers(cachet_allocator* a, uint64_t* bytes_out);

/* torch.cuda.memory_stats(): the flat dict of 122 keys. NULL on error. */
char* cachet_stats_json(cachet_allocator* a);
/* torch.cuda.memory_snapshot(): a list of segments, each with its blocks. NULL on error. */
char* cachet_snapshot_json(cachet_allocator* a);
/* torch.cuda.memory_summary(). NULL on error. */
char* cachet_summary(cachet_allocator* a);
void cachet_string_free(char* s);

/* The message of this thread's last failing call ("" if none). Valid until the next call. */
const char* cachet_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* CACHET_CACHET_H */
