/*
 * test_transport.c - the evidence behind a worker's claim to use shared memory
 * (src/server/core/transport.h): the permission rule on the segment file, and the check of a
 * real peer over a socket pair against a real file.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/kvp_assert.h"
#include "core/transport.h"

static void test_mode_rule(void **state)
{
    (void)state;
    uint32_t none[1] = {0}, other_groups[2] = {7, 100};

    /* The owner class decides for the owner, with read and write both needed. */
    assert_true(kvp_mode_grants_rw(1000, 1000, 0600, 1000, 1000, none, 0));
    assert_false(kvp_mode_grants_rw(1000, 1000, 0400, 1000, 1000, none, 0));
    assert_false(kvp_mode_grants_rw(1000, 1000, 0200, 1000, 1000, none, 0));
    /* Owner first: an owner without owner bits is refused even when the group would grant. */
    assert_false(kvp_mode_grants_rw(1000, 1000, 0060, 1000, 1000, none, 0));
    /* Another uid: only through the group class, by the primary or a supplementary group. */
    assert_false(kvp_mode_grants_rw(0, 0, 0600, 65534, 65534, none, 0));
    assert_false(kvp_mode_grants_rw(0, 100, 0600, 65534, 65534, other_groups, 2));
    assert_true(kvp_mode_grants_rw(0, 100, 0660, 65534, 65534, other_groups, 2));
    assert_true(kvp_mode_grants_rw(0, 65534, 0660, 65534, 65534, none, 0));
    assert_false(kvp_mode_grants_rw(0, 100, 0640, 65534, 65534, other_groups, 2));
    assert_false(kvp_mode_grants_rw(0, 100, 0660, 65534, 65534, other_groups, 1));
    /* A member of the group is judged by the group class, not the others class. */
    assert_false(kvp_mode_grants_rw(0, 100, 0606, 65534, 100, none, 0));
    assert_true(kvp_mode_grants_rw(0, 100, 0606, 65534, 7, none, 0));
    /* Root may open anything. */
    assert_true(kvp_mode_grants_rw(1000, 1000, 0000, 0, 0, none, 0));
}

/*
 * A posix segment of this process (fd of a real file): the peer of a socket pair is this
 * process, so it is the owner and may map it while the owner bits allow; the file's mode is read
 * at each check.
 */
static void test_peer_of_posix_segment(void **state)
{
    (void)state;
    char path[] = "/tmp/kvp_test_transport_XXXXXX", why[256];
    int sv[2];
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    assert_rc(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    struct kvp_segment seg = {.fd = fd, .shared = true};
    snprintf(seg.name, sizeof(seg.name), "kvpool_l1_pool_test");

    assert_rc(fchmod(fd, 0600), 0);
    assert_true(kvp_transport_peer_can_map(&seg, sv[0], false, why, sizeof(why)));
    if (geteuid() != 0) {
        /* Not for root, who may open anything whatever the mode. */
        assert_rc(fchmod(fd, 0400), 0);
        assert_false(kvp_transport_peer_can_map(&seg, sv[0], false, why, sizeof(why)));
        assert_non_null(strstr(why, "cannot open /dev/shm/kvpool_l1_pool_test"));
    }
    /* Without a segment, nobody can map it. */
    seg.shared = false;
    assert_false(kvp_transport_peer_can_map(&seg, sv[0], true, why, sizeof(why)));
    close(sv[0]);
    close(sv[1]);
    close(fd);
}

/* memfd: only having been passed the descriptor counts. */
static void test_peer_of_memfd_segment(void **state)
{
    (void)state;
    char why[256];
    int sv[2];
    assert_rc(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    struct kvp_segment seg = {.fd = -1, .shared = true, .memfd = true};
    assert_false(kvp_transport_peer_can_map(&seg, sv[0], false, why, sizeof(why)));
    assert_non_null(strstr(why, "never passed"));
    assert_true(kvp_transport_peer_can_map(&seg, sv[0], true, why, sizeof(why)));
    close(sv[0]);
    close(sv[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mode_rule),
        cmocka_unit_test(test_peer_of_posix_segment),
        cmocka_unit_test(test_peer_of_memfd_segment),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
