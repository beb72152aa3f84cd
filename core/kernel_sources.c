#include "kernel_sources.h"

#include <string.h>

/* Defined in the generated file (cmake/embed_kernels.cmake). */
extern const fa_kernel_source fa_kernel_source_table[];
extern const int fa_kernel_source_table_count;

int fa_kernel_source_count(void) { return fa_kernel_source_table_count; }

const fa_kernel_source *fa_kernel_source_get(int index) {
    if (index < 0 || index >= fa_kernel_source_table_count) return NULL;
    return &fa_kernel_source_table[index];
}

const fa_kernel_source *fa_kernel_source_find(const char *path) {
    if (!path) return NULL;
    for (int i = 0; i < fa_kernel_source_table_count; i++)
        if (strcmp(fa_kernel_source_table[i].path, path) == 0) return &fa_kernel_source_table[i];
    return NULL;
}
