# ckptfs — build, test, demo, bench.
#   make            build build/ckptfs
#   make check      install missing Debian packages, build, run the TAP suite with prove
#   make check SANITIZE=1   the same suite built with ASan + UBSan (in build-san/)
#   make demo       mount a generated sample checkpoint and show it
#   make bench      read path vs the source file, a bare FUSE daemon and the peers; shards,
#                   mounts, staging, .zst vs zstd -dc and squashfuse, strided views, the
#                   first walk of a 100k-tensor tree, stats/diff, ZeRO/Meta MP layouts, remote sources
#                   behind a delaying proxy, serve vs nginx, torch 2.x's DCP consolidation
#                   (tests/bench/, results in $(B)/bench-out/)

CC      ?= cc
SANITIZE ?=
WERROR  ?= -Werror
PKGS    := fuse3

ifeq ($(SANITIZE),1)
B       := build-san
OPT     := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
LDSAN   := -fsanitize=address,undefined
else
B       := build
OPT     := -O2 -g
LDSAN   :=
endif

CFLAGS_ALL := -std=c17 -D_GNU_SOURCE -Wall -Wextra $(WERROR) -Wshadow -Wvla -Wformat=2 \
              -Wno-format-nonliteral $(OPT) $(CPPFLAGS) $(CFLAGS)
FUSE_CFLAGS = $(shell pkg-config --cflags fuse3 2>/dev/null)
FUSE_LIBS   = $(shell pkg-config --libs fuse3 2>/dev/null)
MHD_LIBS    = $(shell pkg-config --libs libmicrohttpd 2>/dev/null || echo -lmicrohttpd)
# HDF5 (Keras weights) through Debian's serial libhdf5, whose headers live in a folder of their own.
HDF5_CFLAGS = $(shell pkg-config --cflags hdf5 2>/dev/null || echo -I/usr/include/hdf5/serial)
HDF5_LIBS   = -L/usr/lib/$(shell gcc -print-multiarch)/hdf5/serial -lhdf5_hl -lhdf5
CORE_LIBS   = -lcbor -lz -lzstd -lm -lcurl $(HDF5_LIBS) -lpthread

# Sources are found, not listed: a new file in any folder of core/ or fs/ is built without edits.
CORE_SRC := $(sort $(shell find core -name '*.c'))
FS_SRC   := $(sort $(shell find fs -name '*.c'))
UNIT_SRC := $(filter-out tests/unit/%_tool.c,$(wildcard tests/unit/*.c))
TOOL_SRC := $(wildcard tests/unit/*_tool.c)
TOOL_BIN := $(TOOL_SRC:tests/unit/%.c=$(B)/tools/%)
CORE_OBJ := $(CORE_SRC:%.c=$(B)/%.o)
FS_OBJ   := $(FS_SRC:%.c=$(B)/%.o)
UNIT_BIN := $(UNIT_SRC:tests/unit/%.c=$(B)/unit/%.t)

PYTHON   := /usr/bin/python3

# The version, in one place: VERSION. ckpt_version() (core/util/version.c), `ckptfs --version`,
# the shared library's file name, libckpt.pc and debian/changelog say it (tests/t/231-libckpt.t).
VERSION  := $(shell cat VERSION)
# libckpt.so's soname major: raised on any change that breaks a program linked against it
# (docs/libckpt.md, "Soname policy"); core/libckpt.map's version node carries the same number.
SOMAJOR  := 0
SONAME   := libckpt.so.$(SOMAJOR)
SOLIB    := $(B)/libckpt.so.$(VERSION)
FIXTURES := $(B)/fixtures

.PHONY: lib install-lib uninstall-lib print-version all deps deps-clients check test demo bench mutate fuzz clean format install uninstall fixtures
all: $(B)/ckptfs lib
lib: $(SOLIB)

# Header dependencies come from the compiler (-MMD, included at the end). core/ is built
# without FUSE's flags, so "no FUSE in core" is enforced by the build, not by review. Its objects
# are position-independent, for libckpt.so as well as libckpt.a; -fno-semantic-interposition
# keeps calls between them inlinable and direct, as in the static program.
CORE_CFLAGS := -fPIC -fno-semantic-interposition
# Objects depend on the flags they were built with, not only on their sources: a flag added
# here (-fPIC for libckpt.so) must not leave a build/ of objects made without it. The flags
# are kept in $(B)/.flags, rewritten only when they change.
FLAGS_NOW = $(CFLAGS_ALL) $(CPPFLAGS) $(CORE_CFLAGS) $(HDF5_CFLAGS) $(FUSE_CFLAGS)
ifneq ($(file <$(B)/.flags),$(FLAGS_NOW))
$(shell mkdir -p $(B))
$(file >$(B)/.flags,$(FLAGS_NOW))
endif
$(CORE_OBJ) $(FS_OBJ): $(B)/.flags

$(B)/core/%.o: core/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(CORE_CFLAGS) $(HDF5_CFLAGS) -MMD -MP -c $< -o $@

# The one object that spells the version: a new VERSION rebuilds it alone.
$(B)/core/util/version.o: core/util/version.c VERSION
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(CORE_CFLAGS) -DCKPT_VERSION='"$(VERSION)"' -MMD -MP -c $< -o $@

$(B)/fs/%.o: fs/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(FUSE_CFLAGS) -I. -Ifs -MMD -MP -c $< -o $@

$(B)/libckpt.a: $(CORE_OBJ)
	@rm -f $@ # a fresh archive: objects of removed sources must not linger in it
	ar rcs $@ $^

# libckpt as a shared library exports only core/libckpt.map's functions (the installed headers'
# API); the program keeps linking libckpt.a, which has every symbol fs/ uses.
$(SOLIB): $(CORE_OBJ) core/libckpt.map
	$(CC) -shared $(LDSAN) $(LDFLAGS) -Wl,-soname,$(SONAME) -Wl,--version-script=core/libckpt.map \
	  -Wl,--no-undefined -o $@ $(CORE_OBJ) $(CORE_LIBS)
	ln -sfn $(notdir $@) $(B)/$(SONAME)
	ln -sfn $(SONAME) $(B)/libckpt.so

$(B)/ckptfs: $(FS_OBJ) $(B)/libckpt.a
	$(CC) $(LDSAN) $(LDFLAGS) -o $@ $(FS_OBJ) $(B)/libckpt.a $(FUSE_LIBS) $(MHD_LIBS) $(CORE_LIBS) -lpthread

$(B)/unit/%.t: tests/unit/%.c tests/unit/tap.h $(B)/libckpt.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Icore $(LDSAN) -o $@ $< $(B)/libckpt.a $(CORE_LIBS)

$(B)/tools/%: tests/unit/%.c $(B)/libckpt.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Icore $(LDSAN) -o $@ $< $(B)/libckpt.a $(CORE_LIBS)

$(B)/bench/passthrough $(B)/bench/walkfloor: $(B)/bench/%: tests/bench/%.c tests/bench/bench_session.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(FUSE_CFLAGS) -o $@ $< $(FUSE_LIBS) -lpthread

$(B)/bench/delayproxy: tests/bench/delayproxy.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< -lpthread

$(B)/bench/mmapload: tests/bench/mmapload.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< -lpthread

# Debian packages the build, the tests and the demo need; installed only when missing.
DEB_PKGS := gcc make pkg-config libfuse3-dev fuse3 libcbor-dev zlib1g-dev libzstd-dev zstd libhdf5-dev \
            python3 python3-numpy python3-torch python3-venv perl attr mandoc procps bash-completion libcurl4-openssl-dev \
            nginx libmicrohttpd-dev curl xfsprogs iproute2 util-linux zsh fish
deps:
	@missing=""; for p in $(DEB_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "make deps: run as root (or install:$$missing)"; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

fixtures: $(FIXTURES)/.done
# safetensors fixtures live at the top of $(FIXTURES); every other tests/gen/NAME_fixtures.py
# writes into $(FIXTURES)/NAME.
$(FIXTURES)/.done: $(wildcard tests/gen/*.py)
	@mkdir -p $(FIXTURES)
	$(PYTHON) tests/gen/safetensors_fixtures.py $(FIXTURES)
	@for g in $(filter-out tests/gen/safetensors_fixtures.py,$(wildcard tests/gen/*_fixtures.py)); do \
	  n=$$(basename $$g _fixtures.py); echo "$(PYTHON) $$g $(FIXTURES)/$$n"; \
	  $(PYTHON) $$g $(FIXTURES)/$$n || exit 1; done
	@touch $@

# Every test file runs under a time limit (tests/lib/with-timeout): a hang fails that file by
# name instead of stopping the run. Sanitized builds run several times slower.
TEST_TIMEOUT ?= $(if $(filter 1,$(SANITIZE)),900,300)

# Under SANITIZE=1 the daemons detach from the terminal, so sanitizer reports go to log files
# that fail the run when any appears.
SANLOG := $(abspath $(B))/sanitizer-logs
test: $(B)/ckptfs $(UNIT_BIN) $(TOOL_BIN) fixtures
	@rm -rf $(SANLOG); mkdir -p $(SANLOG)
	CKPTFS=$(abspath $(B)/ckptfs) FIXTURES=$(abspath $(FIXTURES)) UNIT_DIR=$(abspath $(B)/unit) \
	TOOLS=$(abspath $(B)/tools) TEST_TIMEOUT=$(TEST_TIMEOUT) \
	ASAN_OPTIONS=log_path=$(SANLOG)/asan UBSAN_OPTIONS=log_path=$(SANLOG)/ubsan:print_stacktrace=1 \
	LSAN_OPTIONS=suppressions=$(abspath tests/lsan.supp):print_suppressions=0 \
	CLIENTS_PY=$(abspath $(CLIENTS_VENV))/bin/python \
	  prove --timer --exec $(abspath tests/lib/with-timeout) $(or $(TESTS),$(UNIT_BIN) tests/t/*.t)
	@if [ -n "$$(ls -A $(SANLOG))" ]; then echo "sanitizer reports:"; cat $(SANLOG)/*; exit 1; fi

check: deps deps-clients
	$(MAKE) test

# The real clients (torch 2.x, transformers, safetensors, huggingface_hub, gguf, peft, boto3),
# pinned with hashes in tests/clients/requirements.txt, in a virtual environment under build/
# (never installed globally). Reinstalled only when the lock file changes. The python3 first
# on PATH makes it (a CPython >= 3.10 with venv); Debian's /usr/bin/python3 and its torch 1.13
# keep writing the committed fixtures.
CLIENTS_VENV := build/clients-venv
CLIENTS_LOCK := tests/clients/requirements.txt
CLIENTS_PYTHON ?= $(shell command -v python3.11 || command -v python3)
deps-clients: $(CLIENTS_VENV)/.installed
$(CLIENTS_VENV)/.installed: $(CLIENTS_LOCK)
	@test -x $(CLIENTS_VENV)/bin/python || $(CLIENTS_PYTHON) -m venv $(CLIENTS_VENV) \
	  || { echo "deps-clients: cannot make a venv with $(CLIENTS_PYTHON)"; exit 1; }
	$(CLIENTS_VENV)/bin/python -m pip install -q --disable-pip-version-check \
	  --require-hashes -r $(CLIENTS_LOCK) \
	  || { echo "deps-clients: pip install -r $(CLIENTS_LOCK) failed"; exit 1; }
	$(CLIENTS_VENV)/bin/python tests/clients/check_clients.py tests/clients/requirements.in
	@touch $@

demo: deps $(B)/ckptfs
	@tests/demo.sh $(B)/ckptfs

bench: deps deps-clients $(B)/ckptfs $(B)/bench/passthrough $(B)/bench/walkfloor $(B)/bench/delayproxy \
	    $(B)/bench/mmapload
	tests/bench/bench.sh $(B)/ckptfs $(B)/bench/passthrough $(B)/bench-out
	$(PYTHON) tests/bench/passthrough_bench.py $(B)/ckptfs $(B)/bench/passthrough \
	    $(B)/bench/mmapload $(B)/bench-out
	$(PYTHON) tests/bench/shard_bench.py $(B)/ckptfs $(B)/bench-out
	$(PYTHON) tests/bench/mount_bench.py $(B)/ckptfs $(B)/bench-out
	$(PYTHON) tests/bench/peers.py $(B)/ckptfs $(B)/bench/passthrough $(B)/bench-out
	$(PYTHON) tests/bench/stage_bench.py $(B)/ckptfs $(B)/bench-out
	$(PYTHON) tests/bench/zstd_bench.py $(B)/ckptfs $(B)/bench-out
	$(PYTHON) tests/bench/cast_bench.py $(B)/ckptfs $(B)/bench-out
	$(PYTHON) tests/bench/strided_bench.py $(B)/ckptfs $(B)/bench-out
	$(PYTHON) tests/bench/tree_bench.py $(B)/ckptfs $(B)/bench-out --also='-o spin_us=0' \
	    --floor $(B)/bench/walkfloor
	$(PYTHON) tests/bench/stats_bench.py $(B)/ckptfs $(B)/bench-out
	$(PYTHON) tests/bench/layouts_bench.py $(B)/ckptfs $(B)/bench-out
	$(PYTHON) tests/bench/remote_bench.py $(B)/ckptfs $(B)/bench-out $(B)/bench/delayproxy
	$(PYTHON) tests/bench/serve_bench.py $(B)/ckptfs $(B)/bench-out
	$(CLIENTS_VENV)/bin/python tests/bench/dcp_consolidate_bench.py $(B)/ckptfs $(B)/bench-out
	$(CLIENTS_VENV)/bin/python tests/bench/clients_bench.py $(B)/ckptfs $(B)/bench-out
	$(CLIENTS_VENV)/bin/python tests/bench/gguf_view_bench.py $(B)/ckptfs $(B)/bench-out

# Mutation testing of core/'s bounds checks (minutes per file; not part of check):
#   make mutate MUTATE_FILES=core/model/planner.c,core/formats/gguf.c [MUTATE_SAMPLE=N]
#   [MUTATE_TESTS=fast] [MUTATE_OUT=DIR]  (tests/README.md: "Mutation testing")
mutate: deps
	$(PYTHON) tests/mutate/mutate.py $(if $(MUTATE_FILES),--files $(MUTATE_FILES)) \
	  $(if $(MUTATE_SAMPLE),--sample $(MUTATE_SAMPLE)) $(if $(MUTATE_TESTS),--tests $(MUTATE_TESTS)) \
	  $(if $(MUTATE_OUT),--out $(MUTATE_OUT))

# libFuzzer harnesses (clang): each runs FUZZ_SECONDS (default 60) from its seed corpus.
fuzz: deps
	FUZZ_SECONDS=$(or $(FUZZ_SECONDS),60) tests/fuzz/run.sh

# Installation: everything goes under $(DESTDIR)$(PREFIX), the mount helper into
# $(PREFIX)/sbin. mount(8) looks for helpers in /sbin (and /usr/sbin on merged-/usr systems):
# PREFIX=/usr puts it there, or MOUNTHELPERDIR=/sbin for another PREFIX. The helper finds
# ckptfs beside itself (../bin), so nothing in it names a path.
PREFIX       ?= /usr/local
DESTDIR      ?=
BINDIR       := $(PREFIX)/bin
MANDIR       := $(PREFIX)/share/man
COMPLETIONDIR := $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR   := $(PREFIX)/share/zsh/vendor-completions
FISHCOMPDIR  := $(PREFIX)/share/fish/vendor_completions.d
MOUNTHELPERDIR ?= $(PREFIX)/sbin
# The library: LIBDIR is /usr/lib/<multiarch> in the Debian package (debian/rules).
LIBDIR       ?= $(PREFIX)/lib
INCLUDEDIR   := $(PREFIX)/include/ckpt
PKGCONFIGDIR := $(LIBDIR)/pkgconfig
LIB_HEADERS  := ckpt.h read/segread.h

install: $(B)/ckptfs install-lib
	install -D -m 755 $(B)/ckptfs $(DESTDIR)$(BINDIR)/ckptfs
	install -D -m 755 mount-helpers/mount.fuse.ckptfs $(DESTDIR)$(MOUNTHELPERDIR)/mount.fuse.ckptfs
	install -D -m 644 man/ckptfs.1 $(DESTDIR)$(MANDIR)/man1/ckptfs.1
	install -D -m 644 man/ckptfs.5 $(DESTDIR)$(MANDIR)/man5/ckptfs.5
	install -D -m 644 man/mount.fuse.ckptfs.8 $(DESTDIR)$(MANDIR)/man8/mount.fuse.ckptfs.8
	install -D -m 644 mount-helpers/ckptfs.bash-completion $(DESTDIR)$(COMPLETIONDIR)/ckptfs
	install -D -m 644 mount-helpers/ckptfs.zsh-completion $(DESTDIR)$(ZSHCOMPDIR)/_ckptfs
	install -D -m 644 mount-helpers/ckptfs.fish-completion $(DESTDIR)$(FISHCOMPDIR)/ckptfs.fish

# The shared library, its headers (under include/ckpt/, keeping core/'s relative layout so their
# own #include "../ckpt.h" resolve) and libckpt.pc.
install-lib: $(SOLIB)
	install -D -m 644 $(SOLIB) $(DESTDIR)$(LIBDIR)/$(notdir $(SOLIB))
	ln -sfn $(notdir $(SOLIB)) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sfn $(SONAME) $(DESTDIR)$(LIBDIR)/libckpt.so
	for h in $(LIB_HEADERS); do install -D -m 644 core/$$h $(DESTDIR)$(INCLUDEDIR)/$$h || exit 1; done
	@mkdir -p $(DESTDIR)$(PKGCONFIGDIR)
	sed -e 's|@PREFIX@|$(PREFIX)|; s|@LIBDIR@|$(LIBDIR)|; s|@VERSION@|$(VERSION)|' \
	  core/libckpt.pc.in > $(DESTDIR)$(PKGCONFIGDIR)/libckpt.pc
	chmod 644 $(DESTDIR)$(PKGCONFIGDIR)/libckpt.pc

uninstall: uninstall-lib
	rm -f $(DESTDIR)$(BINDIR)/ckptfs $(DESTDIR)$(MOUNTHELPERDIR)/mount.fuse.ckptfs \
	  $(DESTDIR)$(MANDIR)/man1/ckptfs.1 $(DESTDIR)$(MANDIR)/man5/ckptfs.5 \
	  $(DESTDIR)$(MANDIR)/man8/mount.fuse.ckptfs.8 $(DESTDIR)$(COMPLETIONDIR)/ckptfs \
	  $(DESTDIR)$(ZSHCOMPDIR)/_ckptfs $(DESTDIR)$(FISHCOMPDIR)/ckptfs.fish

uninstall-lib:
	rm -f $(DESTDIR)$(LIBDIR)/$(notdir $(SOLIB)) $(DESTDIR)$(LIBDIR)/$(SONAME) \
	  $(DESTDIR)$(LIBDIR)/libckpt.so $(DESTDIR)$(PKGCONFIGDIR)/libckpt.pc \
	  $(addprefix $(DESTDIR)$(INCLUDEDIR)/,$(LIB_HEADERS))
	-rmdir $(DESTDIR)$(INCLUDEDIR)/read $(DESTDIR)$(INCLUDEDIR) 2>/dev/null

format:
	clang-format -i $(CORE_SRC) $(FS_SRC) $(UNIT_SRC) $(shell find core fs -name '*.h') $(wildcard tests/unit/*.h)

clean:
	rm -rf build build-san

# For scripts and tests: the one version, as the build uses it.
print-version:
	@echo $(VERSION)

-include $(CORE_OBJ:.o=.d) $(FS_OBJ:.o=.d)
