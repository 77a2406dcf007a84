#include "ranges.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct node {
    pm__range r;
    struct node *left, *right;
    int height;
    bool published;
} node;

struct pm__ranges {
    pthread_rwlock_t lock; /* guards the whole tree */
    node *root;
    size_t published_count;
};

static uintptr_t extent_end(const pm__range *r) { return r->pin_base + r->pin_len; }
static int height(const node *n) { return n ? n->height : 0; }
static int max_int(int a, int b) { return a > b ? a : b; }
static void update(node *n) { n->height = 1 + max_int(height(n->left), height(n->right)); }

static node *rotate_right(node *n)
{
    node *l = n->left;
    n->left = l->right;
    l->right = n;
    update(n);
    update(l);
    return l;
}

static node *rotate_left(node *n)
{
    node *r = n->right;
    n->right = r->left;
    r->left = n;
    update(n);
    update(r);
    return r;
}

static node *rebalance(node *n)
{
    update(n);
    int balance = height(n->left) - height(n->right);
    if (balance > 1) {
        if (height(n->left->left) < height(n->left->right))
            n->left = rotate_left(n->left);
        return rotate_right(n);
    }
    if (balance < -1) {
        if (height(n->right->right) < height(n->right->left))
            n->right = rotate_right(n->right);
        return rotate_left(n);
    }
    return n;
}

static node *insert(node *t, node *fresh)
{
    if (!t)
        return fresh;
    if (fresh->r.pin_base < t->r.pin_base)
        t->left = insert(t->left, fresh);
    else
        t->right = insert(t->right, fresh);
    return rebalance(t);
}

static node *detach_min(node *t, node **min)
{
    if (!t->left) {
        *min = t;
        return t->right;
    }
    t->left = detach_min(t->left, min);
    return rebalance(t);
}

/* Unlinks the node keyed pin_base and hands it back in *gone. */
static node *erase(node *t, uintptr_t pin_base, node **gone)
{
    if (!t)
        return NULL;
    if (pin_base < t->r.pin_base) {
        t->left = erase(t->left, pin_base, gone);
    } else if (pin_base > t->r.pin_base) {
        t->right = erase(t->right, pin_base, gone);
    } else {
        *gone = t;
        if (!t->left)
            return t->right;
        if (!t->right)
            return t->left;
        node *successor;
        node *right = detach_min(t->right, &successor);
        successor->right = right;
        successor->left = t->left;
        return rebalance(successor);
    }
    return rebalance(t);
}

/* The node with the greatest extent base <= addr. */
static node *floor_node(node *t, uintptr_t addr)
{
    node *best = NULL;
    while (t) {
        if (t->r.pin_base <= addr) {
            best = t;
            t = t->right;
        } else {
            t = t->left;
        }
    }
    return best;
}

/* The node with the smallest extent base >= addr. */
static node *ceil_node(node *t, uintptr_t addr)
{
    node *best = NULL;
    while (t) {
        if (t->r.pin_base >= addr) {
            best = t;
            t = t->left;
        } else {
            t = t->right;
        }
    }
    return best;
}

static node *find_pin_base(node *t, uintptr_t pin_base)
{
    while (t && t->r.pin_base != pin_base)
        t = pin_base < t->r.pin_base ? t->left : t->right;
    return t;
}

pm__ranges *pm__ranges_create(void)
{
    pm__ranges *set = calloc(1, sizeof *set);
    if (set && pthread_rwlock_init(&set->lock, NULL) != 0) {
        free(set);
        return NULL;
    }
    return set;
}

static void free_tree(node *t)
{
    if (!t)
        return;
    free_tree(t->left);
    free_tree(t->right);
    free(t);
}

void pm__ranges_destroy(pm__ranges *set)
{
    if (!set)
        return;
    free_tree(set->root);
    pthread_rwlock_destroy(&set->lock);
    free(set);
}

static bool bytes_overlap(const pm__range *r, uintptr_t lo, uintptr_t hi)
{
    return r->base < hi && lo < r->base + r->size;
}

/* lock held: the node after n in address order. */
static node *successor(node *root, const node *n)
{
    return n->r.pin_base == UINTPTR_MAX ? NULL : ceil_node(root, n->r.pin_base + 1);
}

/* The node whose extent intersects [lo, hi) that a conflict names: the first
 * in address order whose user bytes intersect it, else the first. Only the
 * floor of lo and the nodes from lo on can intersect it, since extents do not
 * overlap each other. */
static node *overlapping(node *root, uintptr_t lo, uintptr_t hi)
{
    node *first = NULL;
    node *n = floor_node(root, lo);
    if (!n || extent_end(&n->r) <= lo)
        n = ceil_node(root, lo);
    for (; n && n->r.pin_base < hi; n = successor(root, n)) {
        if (bytes_overlap(&n->r, lo, hi))
            return n;
        if (!first)
            first = n;
    }
    return first;
}

/* lock held: the bytes of the pages [b, e) touches (e > b) that neither prev,
 * the extent before it, nor next, the one after, touches: only its first and
 * last page can be shared, since its bytes cover every page between. */
static size_t own_page_bytes(uintptr_t b, uintptr_t e, const node *prev, const node *next,
                             size_t page)
{
    const uintptr_t mask = page - 1, lo = b & ~mask, last = (e - 1) | mask;
    const bool first_shared = prev && extent_end(&prev->r) > lo;
    const bool last_shared = next && next->r.pin_base <= last;
    if (last - lo < page) /* one page */
        return first_shared || last_shared ? 0 : page;
    return (size_t)(last - lo + 1) - (first_shared ? page : 0) - (last_shared ? page : 0);
}

/* lock held: a registration of the other read_only that shares the first
 * page of [b, e) (e > b; no extent overlaps it) from below, or its last from
 * above. Registrations on one page are all of one kind, so the nearest on
 * each side answers for its page; other kinds of range are passed over. */
static const node *other_kind_on_pages(node *root, uintptr_t b, uintptr_t e, size_t page,
                                       bool read_only)
{
    const uintptr_t mask = page - 1, lo = b & ~mask, last = (e - 1) | mask;
    for (node *n = floor_node(root, b); n && extent_end(&n->r) > lo;
         n = n->r.pin_base ? floor_node(root, n->r.pin_base - 1) : NULL)
        if (n->r.kind == PM__RANGE_REGISTERED) {
            if (n->r.read_only != read_only)
                return n;
            break;
        }
    for (node *n = ceil_node(root, e); n && n->r.pin_base <= last; n = successor(root, n))
        if (n->r.kind == PM__RANGE_REGISTERED)
            return n->r.read_only != read_only ? n : NULL;
    return NULL;
}

static bool claim(pm__ranges *set, const pm__range *r, size_t page,
                  bool (*take)(size_t, void *), void *ctx, pm__range *conflict)
{
    /* An extent that is empty or wraps cannot be ordered against the others:
     * the overlap check would miss what lies past the wrap. */
    conflict->kind = 0;
    if (r->pin_len == 0 || r->pin_len > UINTPTR_MAX - r->pin_base)
        return false;
    node *added = calloc(1, sizeof *added);
    if (!added)
        return false;
    added->r = *r;
    added->height = 1;
    const uintptr_t end = extent_end(r);
    pthread_rwlock_wrlock(&set->lock);
    const node *in_way = overlapping(set->root, r->pin_base, end);
    if (!in_way && take)
        in_way = other_kind_on_pages(set->root, r->pin_base, end, page, r->read_only);
    bool claimed = false;
    if (in_way)
        *conflict = in_way->r;
    else
        claimed = !take || take(own_page_bytes(r->pin_base, end, floor_node(set->root, r->pin_base),
                                               ceil_node(set->root, end), page),
                                ctx);
    if (claimed)
        set->root = insert(set->root, added);
    pthread_rwlock_unlock(&set->lock);
    if (!claimed)
        free(added);
    return claimed;
}

bool pm__ranges_claim(pm__ranges *set, const pm__range *r, pm__range *conflict)
{
    return claim(set, r, 0, NULL, NULL, conflict);
}

bool pm__ranges_claim_pages(pm__ranges *set, const pm__range *r, size_t page,
                            bool (*take)(size_t bytes, void *ctx), void *ctx,
                            pm__range *conflict)
{
    return claim(set, r, page, take, ctx, conflict);
}

void pm__ranges_publish(pm__ranges *set, const pm__range *r)
{
    pthread_rwlock_wrlock(&set->lock);
    node *n = find_pin_base(set->root, r->pin_base);
    if (n && !n->published) {
        n->r = *r;
        n->published = true;
        set->published_count++;
    }
    pthread_rwlock_unlock(&set->lock);
}

static size_t withdraw(pm__ranges *set, uintptr_t pin_base, size_t page)
{
    node *gone = NULL;
    size_t freed = 0;
    pthread_rwlock_wrlock(&set->lock);
    node *n = find_pin_base(set->root, pin_base);
    if (n && !n->published) {
        const uintptr_t end = extent_end(&n->r);
        if (page)
            freed = own_page_bytes(pin_base, end,
                                   pin_base ? floor_node(set->root, pin_base - 1) : NULL,
                                   ceil_node(set->root, end), page);
        set->root = erase(set->root, pin_base, &gone);
    }
    pthread_rwlock_unlock(&set->lock);
    free(gone);
    return freed;
}

void pm__ranges_withdraw(pm__ranges *set, uintptr_t pin_base) { withdraw(set, pin_base, 0); }

size_t pm__ranges_withdraw_pages(pm__ranges *set, uintptr_t pin_base, size_t page)
{
    return withdraw(set, pin_base, page);
}

pm__range_place pm__ranges_locate(pm__ranges *set, uintptr_t addr, pm__range *out)
{
    pm__range_place place = PM__PLACE_NONE;
    pthread_rwlock_rdlock(&set->lock);
    node *n = floor_node(set->root, addr);
    if (n && n->published && addr < extent_end(&n->r)) {
        *out = n->r;
        place = addr >= n->r.base && addr - n->r.base < n->r.size ? PM__PLACE_BYTES
                                                                   : PM__PLACE_SLACK;
    }
    pthread_rwlock_unlock(&set->lock);
    return place;
}

static bool lookup(pm__ranges *set, uintptr_t addr, bool user_bytes, pm__range *out)
{
    bool hit = false;
    pthread_rwlock_rdlock(&set->lock);
    node *n = floor_node(set->root, addr);
    if (n && n->published) {
        if (user_bytes)
            hit = addr >= n->r.base && addr - n->r.base < n->r.size;
        else
            hit = addr < extent_end(&n->r);
        if (hit)
            *out = n->r;
    }
    pthread_rwlock_unlock(&set->lock);
    return hit;
}

bool pm__ranges_find(pm__ranges *set, uintptr_t addr, pm__range *out)
{
    return lookup(set, addr, true, out);
}

bool pm__ranges_find_extent(pm__ranges *set, uintptr_t addr, pm__range *out)
{
    return lookup(set, addr, false, out);
}

pm__retire_outcome pm__ranges_retire(pm__ranges *set, uintptr_t base, unsigned kind_mask,
                                     pm__range *out)
{
    pm__retire_outcome outcome = PM__RETIRE_NOT_TRACKED;
    pthread_rwlock_wrlock(&set->lock);
    node *n = floor_node(set->root, base);
    if (n && n->published && base < extent_end(&n->r)) {
        *out = n->r;
        if (n->r.base == base && (n->r.kind & kind_mask)) {
            n->published = false;
            set->published_count--;
            outcome = PM__RETIRED;
        } else if (base >= n->r.base && base - n->r.base < n->r.size) {
            outcome = PM__RETIRE_MISMATCH;
        } else {
            outcome = PM__RETIRE_SLACK;
        }
    }
    pthread_rwlock_unlock(&set->lock);
    return outcome;
}

/* lock held: the published range with the lowest extent base above addr. */
static bool next_extent_locked(pm__ranges *set, uintptr_t addr, pm__range *out)
{
    for (uintptr_t from = addr + 1; from > addr;) {
        node *n = ceil_node(set->root, from);
        if (!n)
            return false;
        if (n->published) {
            *out = n->r;
            return true;
        }
        from = n->r.pin_base + 1; /* pending: not pinned yet, look past it */
    }
    return false;
}

pm__extent_found pm__ranges_extent_at_or_after(pm__ranges *set, uintptr_t addr, pm__range *out)
{
    pm__extent_found found = PM__EXTENT_NONE;
    pthread_rwlock_rdlock(&set->lock);
    node *n = floor_node(set->root, addr);
    if (n && n->published && addr < extent_end(&n->r)) {
        *out = n->r;
        found = PM__EXTENT_AT;
    } else if (next_extent_locked(set, addr, out)) {
        found = PM__EXTENT_AFTER;
    }
    pthread_rwlock_unlock(&set->lock);
    return found;
}

/* lock held, addr in no published extent: the end of the published extent
 * below addr, 0 where there is none. */
static uintptr_t previous_end_locked(pm__ranges *set, uintptr_t addr)
{
    for (uintptr_t at = addr;;) {
        node *n = floor_node(set->root, at);
        if (!n)
            return 0;
        if (n->published)
            return extent_end(&n->r);
        if (n->r.pin_base == 0)
            return 0;
        at = n->r.pin_base - 1; /* pending: not pinned yet, look below it */
    }
}

bool pm__ranges_extent_or_gap(pm__ranges *set, uintptr_t addr, pm__range *out,
                              uintptr_t *gap_lo, uintptr_t *gap_hi)
{
    bool in_extent = false;
    pthread_rwlock_rdlock(&set->lock);
    node *n = floor_node(set->root, addr);
    if (n && n->published && addr < extent_end(&n->r)) {
        *out = n->r;
        in_extent = true;
    } else {
        pm__range next;
        *gap_lo = previous_end_locked(set, addr);
        *gap_hi = next_extent_locked(set, addr, &next) ? next.pin_base : UINTPTR_MAX;
    }
    pthread_rwlock_unlock(&set->lock);
    return in_extent;
}

size_t pm__ranges_count(pm__ranges *set)
{
    pthread_rwlock_rdlock(&set->lock);
    size_t n = set->published_count;
    pthread_rwlock_unlock(&set->lock);
    return n;
}

static void walk(const node *t, void (*fn)(const pm__range *, void *), void *ctx)
{
    if (!t)
        return;
    walk(t->left, fn, ctx);
    if (t->published)
        fn(&t->r, ctx);
    walk(t->right, fn, ctx);
}

void pm__ranges_foreach(pm__ranges *set, void (*fn)(const pm__range *, void *), void *ctx)
{
    pthread_rwlock_rdlock(&set->lock);
    walk(set->root, fn, ctx);
    pthread_rwlock_unlock(&set->lock);
}

typedef struct check_state {
    const char *why;
    uintptr_t prev_end;
    size_t published;
} check_state;

static int check(const node *t, check_state *st)
{
    if (!t || st->why)
        return 0;
    int hl = check(t->left, st);
    const pm__range *r = &t->r;
    if (r->pin_len == 0 || r->pin_len > UINTPTR_MAX - r->pin_base)
        st->why = "an extent is empty or wraps around the address space";
    else if (r->pin_base < st->prev_end)
        st->why = "extents overlap or are out of order";
    else if (r->base < r->pin_base || r->base - r->pin_base > r->pin_len ||
             r->size > r->pin_len - (r->base - r->pin_base))
        st->why = "user bytes lie outside the pinned extent";
    st->prev_end = extent_end(r);
    st->published += t->published;
    int hr = check(t->right, st);
    if (t->height != 1 + max_int(hl, hr))
        st->why = "stale height";
    if (hl - hr > 1 || hr - hl > 1)
        st->why = "tree out of balance";
    return t->height;
}

bool pm__ranges_validate(pm__ranges *set, const char **why)
{
    check_state st = {0};
    pthread_rwlock_rdlock(&set->lock);
    check(set->root, &st);
    if (!st.why && st.published != set->published_count)
        st.why = "published count disagrees with the tree";
    pthread_rwlock_unlock(&set->lock);
    if (why)
        *why = st.why;
    return st.why == NULL;
}
