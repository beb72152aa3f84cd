#include "device_registry.h"

#include "fa_internal.h"
#include "reason.h"

void fa_registry_discover(fa_device_registry *r) { pthread_once(&r->once, r->discover); }

void fa_registry_ready(fa_device_registry *r, int count) {
    r->total = count;
    r->status = FA_SUCCESS;
    r->reason[0] = '\0';
}

fa_status fa_registry_init(fa_device_registry *r, char *reason, size_t reason_size) {
    fa_registry_discover(r);
    fa_reason_copy(reason, reason_size, r->status == FA_SUCCESS ? "" : r->reason);
    return r->status;
}

int fa_registry_count(fa_device_registry *r) {
    fa_registry_discover(r);
    return r->status == FA_SUCCESS ? r->total : 0;
}

fa_status fa_registry_unavailable(const fa_device_registry *r) {
    return fa_fail(FA_ERR_BACKEND_UNAVAILABLE, "%s backend unavailable: %s", r->runtime, r->reason);
}

fa_status fa_registry_check(fa_device_registry *r, int index) {
    fa_registry_discover(r);
    if (r->status != FA_SUCCESS) return fa_registry_unavailable(r);
    if (index < 0 || index >= r->total)
        return fa_fail(FA_ERR_DEVICE_NOT_FOUND, "%s device index %d out of range (%d devices)", r->runtime,
                       index, r->total);
    return FA_SUCCESS;
}

fa_status fa_registry_info(fa_device_registry *r, int index, fa_device_info *info) {
    if (!info) return fa_fail(FA_ERR_NULL_POINTER, "info is NULL");
    fa_status st = fa_registry_check(r, index);
    if (st != FA_SUCCESS) return st;
    *info = r->devices[index];
    return FA_SUCCESS;
}
