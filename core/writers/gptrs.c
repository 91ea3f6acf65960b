/* gpt-rs writer: not written yet, refuses clearly. */
#include "../writer.h"

#include <errno.h>

int write_gptrs(out_file *f, const ckpt_catalog *cat, bool archive, ckpt_err *err) {
    (void)cat, (void)archive;
    return ckpt_fail(err, -ENOSYS, "%s: writing gpt-rs is not supported yet", f->final_path);
}
