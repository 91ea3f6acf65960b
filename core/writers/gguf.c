/* gguf writer: not written yet, refuses clearly. */
#include "../writer.h"

#include <errno.h>

int write_gguf(out_file *f, const ckpt_catalog *cat, ckpt_err *err) {
    (void)cat;
    return ckpt_fail(err, -ENOSYS, "%s: writing gguf is not supported yet", f->final_path);
}
