/* The CRC-32 a zip stores for every record (torch.save archives), checked on request: `ckptfs
 * verify` runs it, a mount does not (it would read every byte before serving one). */
#ifndef CKPT_ZIP_CRC_H
#define CKPT_ZIP_CRC_H

#include "../ckpt.h"

typedef struct ckpt_crc_fault {
    uint32_t source;
    const char *record; /* the record's name in the zip, record_len bytes */
    size_t record_len;
    uint64_t offset, length; /* where the record's bytes lie in the source */
    uint32_t stored, computed;
} ckpt_crc_fault;

typedef void (*ckpt_crc_report)(void *ctx, const ckpt_crc_fault *fault);

/* For every source that is a zip, the CRC-32 (zlib's crc32) of every STORED record's bytes is
 * compared with its central directory entry; each that differs is reported. buf is scratch of
 * bufsize bytes. Returns the number of records checked, or a negative errno with err filled
 * when a source cannot be read (a torch-zip catalog's source that is not a readable zip is such
 * an error; other formats' sources that merely start like a zip are left alone). */
long long ckpt_zip_check_crcs(const ckpt_catalog *cat, ckpt_crc_report report, void *ctx, void *buf,
                              size_t bufsize, ckpt_err *err);

#endif
