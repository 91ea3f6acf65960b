/* The library's version, from the tree's VERSION file (the Makefile passes it as CKPT_VERSION
 * to this file alone, so that a new version rebuilds one object). A function rather than a
 * macro in ckpt.h: a program linked against libckpt.so learns the version of the library it
 * runs with, not the one it was compiled against. */
#include "../ckpt.h"

#ifndef CKPT_VERSION
#error "CKPT_VERSION is defined by the Makefile from the file VERSION"
#endif

const char *ckpt_version(void) {
    return CKPT_VERSION;
}
