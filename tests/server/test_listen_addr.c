/*
 * test_listen_addr.c - ADDR:PORT values (listen_addr.c): what --http accepts, the address and
 * port each value means, which are loopback, and what is refused.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "base/listen_addr.h"

static void test_parse_listen(void **state)
{
    (void)state;
    static const struct {
        const char *spec;
        int family; /* 0: off */
        uint16_t port;
        bool loopback;
    } good[] = {
        {"off", 0, 0, false},
        {"127.0.0.1:9190", AF_INET, 9190, true},
        {"localhost:0", AF_INET, 0, true},
        {"9191", AF_INET, 9191, true},
        {"127.1.2.3:5", AF_INET, 5, true},
        {"0.0.0.0:80", AF_INET, 80, false},
        {"192.168.1.20:65535", AF_INET, 65535, false},
        {"[::1]:9190", AF_INET6, 9190, true},
        {"[::]:1", AF_INET6, 1, false},
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        struct kvp_listen_addr l;
        if (kvp_listen_addr_parse(good[i].spec, &l) != 0)
            fail_msg("'%s' refused", good[i].spec);
        assert_int_equal(l.off, good[i].family == 0);
        if (l.off)
            continue;
        assert_int_equal(l.addr.ss_family, good[i].family);
        uint16_t port = ntohs(l.addr.ss_family == AF_INET
                                  ? ((struct sockaddr_in *)&l.addr)->sin_port
                                  : ((struct sockaddr_in6 *)&l.addr)->sin6_port);
        assert_int_equal(port, good[i].port);
        assert_int_equal(l.loopback, good[i].loopback);
    }
    static const char *const bad[] = {
        "",
        ":80",
        "127.0.0.1:",
        "127.0.0.1:65536",
        "127.0.0.1:-1",
        "OFF",
        "host.test:80",
        "::1:80",
        "[::1]",
        "[::1:80",
        "1.2.3:80",
        "127.0.0.1:80x",
        "127.0.0.1: 8",
        "127.0.0.1:123456",
        "[nope]:80",
        "x",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (kvp_listen_addr_parse(bad[i], NULL) != -EINVAL)
            fail_msg("'%s' accepted", bad[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_listen),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
