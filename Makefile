# The front door. Everything real is in CMakeLists.txt; these targets install
# what is missing on a Debian machine, build, and run.
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
PREFIX ?= /usr/local
CMAKE_FLAGS ?=

TSAN_BUILD ?= build-tsan

.PHONY: all deps build demo check check-asan tsan crash chaos fuzz bench bench-gateway bench-mcp bench-duplicates install deb clean format

all: build

deps:
	@sh scripts/deps.sh build

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	@sh scripts/demo.sh $(BUILD)/idem

# Two builds, both tested: the normal one, then one with ASan and UBSan; then
# the engine's tests in a ThreadSanitizer build (make tsan).
check:
	@sh scripts/deps.sh check
	sh scripts/check.sh $(BUILD) $(ASAN_BUILD) $(JOBS) $(TSAN_BUILD)

# The engine's tests on both stores in a ThreadSanitizer build (make check
# runs them too).
tsan:
	@sh scripts/deps.sh check
	sh scripts/tsan.sh $(TSAN_BUILD) $(JOBS)

# The long fault campaigns (docs/reliability.md): CRASH_TRIALS simulated
# power losses with synchronous=FULL, as many with NORMAL, then the I/O
# fault tests.
CRASH_TRIALS ?= 5000
crash: build
	@sh scripts/deps.sh check
	cmake -S . -B $(BUILD) -DBUILD_TESTING=ON >/dev/null
	cmake --build $(BUILD) -j $(JOBS) --target test_powerloss
	nice -n 10 $(BUILD)/tests/test_powerloss --sync full --trials $(CRASH_TRIALS)
	nice -n 10 $(BUILD)/tests/test_powerloss --sync normal --trials $(CRASH_TRIALS)
	nice -n 10 $(BUILD)/tests/test_powerloss --sync full --faults --trials $(CRASH_TRIALS)
	cmake --build $(BUILD) -j $(JOBS) --target test_iofaults
	$(BUILD)/tests/test_iofaults

# BASE=<commit>: only idem bench, side by side with a build of that commit
# (ROUNDS pairs, default 5; bench/compare.sh). Otherwise every benchmark;
# each one's figures are kept in $(BUILD)/bench/NAME.txt, and bench/plot.py
# draws the charts there (workers.png, latency.png, slow_upstream.png).
OUT = $(abspath $(BUILD))/bench
# $(call keep,NAME,COMMAND): runs COMMAND, its output kept in OUT/NAME.txt
# and shown; fails when COMMAND fails.
keep = r=0; $(2) >$(OUT)/$(1).txt || r=$$?; cat $(OUT)/$(1).txt; exit $$r
bench: build
	@sh scripts/deps.sh bench
ifneq ($(BASE),)
	BASE='$(BASE)' sh bench/run.sh $(BUILD)/idem
else
	mkdir -p $(OUT)
	$(call keep,run,BENCH_OUT=$(OUT) sh bench/run.sh $(BUILD)/idem)
	$(call keep,engine,sh bench/engine.sh $(BUILD))
	$(call keep,gateway,BENCH_OUT=$(OUT) sh bench/gateway.sh $(BUILD)/idem)
	$(call keep,mcp,sh bench/mcp.sh $(BUILD)/idem)
	$(call keep,python,python3 bench/python.py $(BUILD))
	$(call keep,canon,sh bench/canon.sh $(BUILD)/idem)
	$(call keep,duplicates,sh bench/duplicates.sh $(BUILD)/idem)
	python3 bench/plot.py $(OUT)
endif

# Only idem serve's benchmark (bench/gateway.sh).
bench-gateway: build
	@sh scripts/deps.sh bench
	sh bench/gateway.sh $(BUILD)/idem

# Only idem mcp's benchmark (bench/mcp.sh).
bench-mcp: build
	@sh scripts/deps.sh bench
	sh bench/mcp.sh $(BUILD)/idem

# Only the duplicate-execution benchmark (bench/duplicates.sh; BENCH_QUICK=1
# for a short run).
bench-duplicates: build
	@sh scripts/deps.sh bench
	sh bench/duplicates.sh $(BUILD)/idem

# The long kill -9 campaign (tests/chaos): CHAOS_TRIALS trials per store.
CHAOS_TRIALS ?= 10000
chaos: build
	@sh scripts/deps.sh check
	CHAOS_TRIALS=$(CHAOS_TRIALS) sh tests/chaos/long.sh $(BUILD)

# Each libFuzzer driver of tests/fuzz for FUZZ_SECONDS (clang build).
FUZZ_SECONDS ?= 60
fuzz:
	@sh scripts/deps.sh fuzz
	FUZZ_SECONDS=$(FUZZ_SECONDS) JOBS=$(JOBS) sh scripts/fuzz.sh

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

# A Debian package of everything `make install` installs, in a build of its
# own for /usr with Debian's hardening flags (cmake/Deb.cmake), checked by
# lintian: no error allowed.
DEB_BUILD ?= build-deb
deb: export DEB_BUILD_MAINT_OPTIONS = hardening=+all
deb:
	@sh scripts/deps.sh deb
	cmake -S . -B $(DEB_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_C_FLAGS="$$(dpkg-buildflags --get CPPFLAGS) $$(dpkg-buildflags --get CFLAGS)" \
	  -DCMAKE_EXE_LINKER_FLAGS="$$(dpkg-buildflags --get LDFLAGS)" \
	  -DCMAKE_SHARED_LINKER_FLAGS="$$(dpkg-buildflags --get LDFLAGS)" \
	  -DCMAKE_INSTALL_PREFIX=/usr -DIDEM_DEB=ON -DBUILD_TESTING=OFF \
	  -DIDEM_SYSTEMD_UNITDIR=/lib/systemd/system \
	  -DIDEM_ZSH_COMPLETIONDIR=share/zsh/vendor-completions $(CMAKE_FLAGS) >/dev/null
	cmake --build $(DEB_BUILD) -j $(JOBS)
	cd $(DEB_BUILD) && cpack -G DEB
	lintian --fail-on error $(DEB_BUILD)/idem_*.deb
	sh tests/deb.sh $(DEB_BUILD)/idem_*.deb .

format:
	clang-format -i include/*.h lib/*.c lib/*.h src/*.c src/*.h src/mcp/*.c \
	  src/mcp/*.h tests/*.c

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) build-fuzz
