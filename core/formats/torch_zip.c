/* torch-zip: not implemented yet — the probe never matches. */
#include "formats.h"

#include <errno.h>

static bool probe(const unsigned char *head, size_t n, uint64_t file_size) {
    (void)head, (void)n, (void)file_size;
    return false;
}

static int load(ckpt_catalog *cat, uint32_t source, ckpt_err *err) {
    return ckpt_fail(err, -EPROTONOSUPPORT, "%s: torch-zip is not supported yet", cat->sources[source].path);
}

const ckpt_format format_torch_zip = {"torch-zip", probe, load};
