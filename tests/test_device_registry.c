/* The once-only device registry GPU backends keep: the statuses and messages
 * callers see with and without devices, and discovery running exactly once
 * however many threads ask first. */
#include "device_registry.h"
#include "harness.h"
#include "reason.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int failing_runs;
static void failing_discover(void);
static fa_device_registry failing = FA_DEVICE_REGISTRY_INIT("TESTRT", failing_discover);
static void failing_discover(void) {
    failing_runs++;
    fa_reason_set(failing.reason, sizeof failing.reason, "no TESTRT device (%s)", "driver absent");
}

static int ready_runs;
static void ready_discover(void);
static fa_device_registry ready = FA_DEVICE_REGISTRY_INIT("TESTRT", ready_discover);
static void ready_discover(void) {
    __atomic_add_fetch(&ready_runs, 1, __ATOMIC_SEQ_CST);
    for (int i = 0; i < 2; i++) {
        ready.devices[i].index = i;
        snprintf(ready.devices[i].desc.name, sizeof ready.devices[i].desc.name, "dev%d", i);
    }
    fa_registry_ready(&ready, 2);
}

FA_TEST(unavailable_says_why) {
    char reason[64];
    memset(reason, 'x', sizeof reason);
    CHECK_STATUS(fa_registry_init(&failing, reason, sizeof reason), FA_ERR_BACKEND_UNAVAILABLE);
    CHECK_MSG(strcmp(reason, "no TESTRT device (driver absent)") == 0, "reason: %s", reason);
    CHECK(fa_registry_count(&failing) == 0);
    fa_device_info info;
    CHECK_FAILS(fa_registry_info(&failing, 0, &info), FA_ERR_BACKEND_UNAVAILABLE,
                "TESTRT backend unavailable: no TESTRT device (driver absent)");
    CHECK_FAILS(fa_registry_check(&failing, 0), FA_ERR_BACKEND_UNAVAILABLE, "TESTRT backend unavailable");
    CHECK_FAILS(fa_registry_info(&failing, 0, NULL), FA_ERR_NULL_POINTER, "info is NULL");
    CHECK(failing_runs == 1);
}

static void *count_from_thread(void *arg) {
    (void)arg;
    return (void *)(intptr_t)fa_registry_count(&ready);
}

FA_TEST(ready_devices_discovered_once) {
    pthread_t threads[8];
    int started = 0;
    for (int i = 0; i < 8; i++)
        if (pthread_create(&threads[i], NULL, count_from_thread, NULL) == 0) started++;
    CHECK(started == 8);
    for (int i = 0; i < started; i++) {
        void *count = NULL;
        CHECK(pthread_join(threads[i], &count) == 0);
        CHECK((intptr_t)count == 2);
    }
    CHECK(__atomic_load_n(&ready_runs, __ATOMIC_SEQ_CST) == 1);

    char reason[16];
    memset(reason, 'x', sizeof reason);
    CHECK_OK(fa_registry_init(&ready, reason, sizeof reason));
    CHECK(reason[0] == '\0');
    CHECK_OK(fa_registry_init(&ready, NULL, 0));
    fa_device_info info;
    CHECK_OK(fa_registry_info(&ready, 1, &info));
    CHECK(info.index == 1 && strcmp(info.desc.name, "dev1") == 0);
    CHECK_OK(fa_registry_check(&ready, 0));
    CHECK_FAILS(fa_registry_check(&ready, 2), FA_ERR_DEVICE_NOT_FOUND,
                "TESTRT device index 2 out of range (2 devices)");
    CHECK_FAILS(fa_registry_info(&ready, -1, &info), FA_ERR_DEVICE_NOT_FOUND,
                "TESTRT device index -1 out of range (2 devices)");
    CHECK(__atomic_load_n(&ready_runs, __ATOMIC_SEQ_CST) == 1);
}

FA_TEST_MAIN(FA_CASE(unavailable_says_why), FA_CASE(ready_devices_discovered_once))
