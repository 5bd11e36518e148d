/* Python's small-object arenas on transparent huge pages (servelab/simulator/hugepage_arenas.py).
 *
 * pymalloc asks for its 1 MiB arenas one mmap at a time; on a machine whose THP mode is
 * "madvise" they are 4 KiB pages. Here they are cut one after another out of one reserved,
 * 2 MiB-aligned region marked MADV_HUGEPAGE, so a simulation's objects sit on 2 MiB pages.
 * Called by pymalloc with the GIL held. A freed arena is kept for reuse (its memory is not
 * returned to the system while the process lives); an arena that does not fit the region, or
 * any arena if the region cannot be reserved, is an ordinary mmap as before.
 */
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

#define RESERVE (64ULL << 30) /* address space only (MAP_NORESERVE): memory is used as arenas are */
#define HUGE_PAGE (2ULL << 20)
#define MAX_KEPT 65536

static char *base, *next, *end;
static int failed;
static void *kept[MAX_KEPT];
static size_t num_kept, arena_bytes;

static int reserve(void) {
    char *p = mmap(0, RESERVE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        failed = 1;
        return -1;
    }
    base = next = (char *)(((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    end = p + RESERVE;
    madvise(base, (size_t)(end - base), MADV_HUGEPAGE);
    return 0;
}

static void *plain(size_t size) {
    void *p = mmap(0, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? 0 : p;
}

void *servelab_arena_alloc(void *ctx, size_t size) {
    (void)ctx;
    if (size == arena_bytes && num_kept) return kept[--num_kept];
    if (failed || (!base && reserve())) return plain(size);
    size_t n = (size + 4095) & ~(size_t)4095;
    if ((size_t)(end - next) < n) return plain(size);
    if (!arena_bytes) arena_bytes = size;
    void *p = next;
    next += n;
    return p;
}

void servelab_arena_free(void *ctx, void *ptr, size_t size) {
    (void)ctx;
    if ((char *)ptr >= base && (char *)ptr < next) {
        if (size == arena_bytes && num_kept < MAX_KEPT) kept[num_kept++] = ptr;
        return; /* inside the region: never unmapped */
    }
    munmap(ptr, size);
}

size_t servelab_arena_region_bytes(void) { return base ? (size_t)(next - base) : 0; }
