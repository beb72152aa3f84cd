/* A CUBIN is a 64-bit little-endian ELF file. The kernel's symbol index
 * keys its attributes in the section ".nv.info": a list of records
 * {u8 format, u8 attribute, payload}, where format 4 carries a u16 size and
 * that many bytes (for the per-kernel attributes: u32 symbol index, u32
 * value), format 3 a u16 value, format 2 a u8 value and format 1 nothing.
 * EIATTR_REGCOUNT (0x2f) is the register count, EIATTR_FRAME_SIZE (0x11)
 * the stack frame in bytes. */
#include "cubin_info.h"

#include <stdint.h>
#include <string.h>

#define ELF_SHT_SYMTAB 2
#define ELF_SHT_NOBITS 8
#define EIATTR_FRAME_SIZE 0x11
#define EIATTR_REGCOUNT 0x2f

typedef struct elf_image {
    const uint8_t *p;
    size_t size;
} elf_image;

static int in_bounds(const elf_image *e, uint64_t off, uint64_t len) {
    return off <= e->size && len <= e->size - off;
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t rd32(const uint8_t *p) { return (uint32_t)rd16(p) | ((uint32_t)rd16(p + 2) << 16); }
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | ((uint64_t)rd32(p + 4) << 32); }

typedef struct section {
    uint32_t name, type, link;
    uint64_t offset, size, entsize;
} section;

static int read_section(const elf_image *e, uint64_t shoff, unsigned shentsize, unsigned i, section *s) {
    const uint64_t at = shoff + (uint64_t)i * shentsize;
    if (shentsize < 64 || !in_bounds(e, at, 64)) return -1;
    const uint8_t *h = e->p + at;
    s->name = rd32(h);
    s->type = rd32(h + 4);
    s->offset = rd64(h + 24);
    s->size = rd64(h + 32);
    s->link = rd32(h + 40);
    s->entsize = rd64(h + 56);
    /* A section without bits in the file (.nv.shared.*, a kernel's static
     * shared memory) may name any offset and size. */
    return s->type == ELF_SHT_NOBITS || in_bounds(e, s->offset, s->size) ? 0 : -1;
}

/* The NUL-terminated string at off in a string-table section, or NULL. */
static const char *string_at(const elf_image *e, const section *strtab, uint64_t off) {
    if (off >= strtab->size) return NULL;
    const char *s = (const char *)e->p + strtab->offset + off;
    return memchr(s, '\0', (size_t)(strtab->size - off)) ? s : NULL;
}

int fa_cubin_kernel_resources(const void *image, size_t size, const char *kernel, int *registers,
                              int *frame_bytes) {
    elf_image e = {image, size};
    if (!image || !kernel || !registers || !frame_bytes || size < 64) return -1;
    if (memcmp(e.p, "\177ELF", 4) != 0 || e.p[4] != 2 /* 64-bit */ || e.p[5] != 1 /* little-endian */) return -1;
    const uint64_t shoff = rd64(e.p + 0x28);
    const unsigned shentsize = rd16(e.p + 0x3a), shnum = rd16(e.p + 0x3c), shstrndx = rd16(e.p + 0x3e);
    section names;
    if (shstrndx >= shnum || read_section(&e, shoff, shentsize, shstrndx, &names) != 0) return -1;

    /* The kernel's index in the symbol table, and the .nv.info section. */
    int64_t symbol = -1;
    section info = {0, 0, 0, 0, 0, 0};
    int have_info = 0;
    for (unsigned i = 0; i < shnum; i++) {
        section s;
        if (read_section(&e, shoff, shentsize, i, &s) != 0) return -1;
        const char *name = string_at(&e, &names, s.name);
        if (name && strcmp(name, ".nv.info") == 0) {
            info = s;
            have_info = 1;
        }
        if (s.type != ELF_SHT_SYMTAB || s.entsize < 24 || symbol >= 0) continue;
        section strtab;
        if (s.link >= shnum || read_section(&e, shoff, shentsize, s.link, &strtab) != 0) return -1;
        for (uint64_t k = 0; k < s.size / s.entsize; k++) {
            const char *sym = string_at(&e, &strtab, rd32(e.p + s.offset + k * s.entsize));
            if (sym && strcmp(sym, kernel) == 0) {
                symbol = (int64_t)k;
                break;
            }
        }
    }
    if (symbol < 0 || !have_info) return -1;

    int regs = -1, frame = -1;
    const uint8_t *p = e.p + info.offset, *end = p + info.size;
    while (end - p >= 2) {
        const uint8_t format = p[0], attr = p[1];
        if (format == 4) {
            if (end - p < 4) break;
            const uint16_t len = rd16(p + 2);
            if (end - p - 4 < len) break;
            if (len == 8 && rd32(p + 4) == (uint32_t)symbol) {
                if (attr == EIATTR_REGCOUNT) regs = (int)rd32(p + 8);
                if (attr == EIATTR_FRAME_SIZE) frame = (int)rd32(p + 8);
            }
            p += 4 + len;
        } else if (format == 3) {
            p += 4;
        } else if (format == 2) {
            p += 3;
        } else if (format == 1) {
            p += 2;
        } else {
            break; /* padding at the end of the section */
        }
    }
    if (regs < 0 || frame < 0) return -1;
    *registers = regs;
    *frame_bytes = frame;
    return 0;
}
