#!/usr/bin/env python3
"""Mutation testing of streamwire's pure modules (one textual change per mutant).

usage: mutate.py list MODULE            -- print the mutants (id, line, op, before -> after)
       mutate.py run MODULE [IDS...]    -- run all (or the given ids); appends to results/MODULE.tsv
       mutate.py emit MODULE ID         -- print the mutated file (source untouched)
       mutate.py one MODULE ID          -- apply one mutant and leave it applied (for inspection); restore with `git checkout FILE`
It edits the module's source in place (restored after each mutant), so run it in a scratch
clone, never in a tree you work in:

    git clone -q /path/to/streamwire /tmp/mut && cd /tmp/mut
    cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSW_BUILD_BENCH=OFF
    python3 tests/mutation/mutate.py run rx      # results/rx.tsv: killed, survived, ...

A survivor is a change no test noticed: read it, and either judge it equivalent or write the
test that kills it (session 41: 674 mutants over eight modules, 153 survivors, 58 real gaps,
tests/unit/'s "mutation-testing pass" tests). About 70 minutes for every module on one core.
"""
import os, re, subprocess, sys, time, random, shutil

ROOT = os.environ.get('SW_MUT_ROOT') or os.getcwd()
B = ROOT + '/build'
U = B + '/tests/unit'
SIM = [U + '/sim_streams', '--seeds', '4', '--messages', '20000']
FUZZ = ['sh', '-c', 'rm -rf %s/fuzz-corpus-gen && %s/fuzz_gen_corpus %s/fuzz-corpus-gen >/dev/null && '
        '%s/fuzz_replay -n 500000 %s/tests/fuzz/corpus %s/fuzz-corpus-gen' % (U, U, U, U, ROOT, U)]

# module -> (file, build targets, test commands in order (cheap first), function names to restrict to or None, max mutants)
MODULES = {
    'rx': ('egress/rx.c', ['test_rx', 'sim_streams'], [[U + '/test_rx'], SIM], None, 260),
    'backlog': ('egress/backlog.c', ['test_rx'], [[U + '/test_rx']], None, 60),
    'merge_core': ('egress/merge_core.c', ['test_merge_core'], [[U + '/test_merge_core']], None, 80),
    'cancels': ('egress/cancels.c', ['test_cancels'], [[U + '/test_cancels']], None, 50),
    'sched': ('common/sched.c', ['test_sched'], [[U + '/test_sched']], (105, 673), 160),
    'items': ('proto/items.c', ['test_codec', 'test_codec_hand', 'test_codec_bounds', 'fuzz_replay', 'fuzz_gen_corpus'],
              [[U + '/test_codec'], [U + '/test_codec_hand'], [U + '/test_codec_bounds'], FUZZ], None, 130),
    'beats': ('proto/beats.c', ['test_codec', 'test_codec_hand', 'test_codec_bounds', 'fuzz_replay', 'fuzz_gen_corpus'],
              [[U + '/test_codec'], [U + '/test_codec_hand'], [U + '/test_codec_bounds'], FUZZ], None, 60),
    'ring': ('ingress/ring.c', ['test_ring'], [[U + '/test_ring']], None, 70),
}

SKIP_RE = re.compile(r'^\s*(#|/\*|\*|//)|\bassert\b|SW_LOG|swi_log|fprintf|sw_log|abort\(\)')
REL = [('<=', '<'), ('>=', '>'), ('==', '!='), ('!=', '=='), ('<', '<='), ('>', '>=')]


def code_part(line):
    i = line.find('/*')
    j = line.find('//')
    cut = min([k for k in (i, j) if k >= 0], default=len(line))
    return line[:cut]


def rel_positions(code):
    """(pos, op) of relational operators, skipping ->, <<, >>, #include <...>."""
    out = []
    i = 0
    while i < len(code):
        two = code[i:i + 2]
        if two in ('->', '<<', '>>', '<<=', '>>='):
            i += 2
            continue
        if two in ('<=', '>=', '==', '!='):
            out.append((i, two))
            i += 2
            continue
        c = code[i]
        if c in '<>':
            # not part of -> / << / >> / >=
            if (c == '>' and i > 0 and code[i - 1] == '-'):
                i += 1
                continue
            out.append((i, c))
        i += 1
    return out


def gen_mutants(path):
    lines = open(path).read().split('\n')
    muts = []
    in_comment = False
    for n, line in enumerate(lines, 1):
        s = line.strip()
        if in_comment:
            if '*/' in s:
                in_comment = False
            continue
        if s.startswith('/*') and '*/' not in s:
            in_comment = True
            continue
        if not s or SKIP_RE.search(line) or s.startswith('}') and len(s) < 3:
            continue
        code = code_part(line)
        # relational
        for pos, op in rel_positions(code):
            rep = dict(REL)[op]
            muts.append((n, 'rel %s->%s' % (op, rep), line[:pos] + rep + line[pos + len(op):]))
        # logical
        for m in re.finditer(r'&&|\|\|', code):
            rep = '||' if m.group() == '&&' else '&&'
            muts.append((n, 'log %s->%s' % (m.group(), rep), line[:m.start()] + rep + line[m.end():]))
        # return constants
        m = re.search(r'\breturn (-?1|0|SW_OK|2);', code)
        if m:
            v = m.group(1)
            reps = {'0': ['1'], '1': ['0'], '-1': ['0'], '2': ['1'], 'SW_OK': ['SW_EINVAL']}[v]
            for r in reps:
                muts.append((n, 'ret %s->%s' % (v, r), line[:m.start(1)] + r + line[m.end(1):]))
        # +1 / -1 deletion
        for m in re.finditer(r'\s*([+-])\s*1\b(?!\d|\.|<<)', code):
            # skip "x - 1" inside of e.g. "i-- > 0" handled separately; skip array-like "[-1]" (rare)
            muts.append((n, 'del %s1' % m.group(1), line[:m.start()] + line[m.end():]))
        # increment/decrement statement deletion
        if re.match(r'^\s*(\+\+|--)?[\w\.\->\[\]\(\)\*]+(\+\+|--)?;\s*$', code) and ('++' in code or '--' in code):
            muts.append((n, 'del incdec', re.match(r'^(\s*)', line).group(1) + ';'))
        else:
            # single-line statement deletion (assignment, compound assignment or call), not decls/returns
            cs = code.strip()
            if (cs.endswith(';') and not re.match(r'^(return|break|continue|goto|case|default|else|if|for|while|do)\b', cs)
                    and not re.match(r'^(const\s+)?(static\s+)?(unsigned|signed|int|char|size_t|uint\w+|int\w+|sw\w*|swe\w*|struct|bool|void|long|short|double)\b[\w\s\*]*\b\w+\s*(=|;|\[)', cs)
                    and cs.count('(') == cs.count(')') and not cs.startswith(')') and not cs.startswith('}')
                    and (re.search(r'[^=!<>]=[^=]', cs) or re.match(r'^\(?(void\)\s*)?\w+\(', cs))):
                prev = lines[n - 2].rstrip() if n >= 2 else ''
                # the line must begin a statement: previous line ends with ; { } or is a control header
                if prev.endswith((';', '{', '}')) or re.search(r'\)\s*$', prev) or prev.strip().startswith(('else', '/*', '*')) or prev.strip().endswith('*/'):
                    muts.append((n, 'del stmt', re.match(r'^(\s*)', line).group(1) + ';'))
    return lines, muts


def sh(cmd, timeout):
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, cwd=U)
        return p.returncode, p.stdout.decode(errors='replace')[-400:]
    except subprocess.TimeoutExpired:
        return 'timeout', ''


NOISE_LINE = re.compile(r'\b(malloc|calloc|realloc)\(|SW_ENOMEM|SW_EINVAL_OOM|-- >')
NOISE_DEL = re.compile(r'\bfree\(|q_free|_free\(|fini\(')


def useful(lines, m):
    n, op, new = m
    line = lines[n - 1]
    if NOISE_LINE.search(line):
        return False
    if op.startswith('rel') and re.search(r'[=!]= NULL|NULL [=!]=', line):
        # a pointer check: only mutate if the op that changes is not next to NULL
        old = line
        k = next(i for i in range(len(old)) if old[i] != new[i])
        around = old[max(0, k - 6):k + 8]
        if 'NULL' in around:
            return False
    if op.startswith('del') and (NOISE_DEL.search(line) or 'return -1' in line):
        return False
    return True


def select(muts, cap, lines=None):
    if lines is not None:
        keep = [i for i, m in enumerate(muts) if useful(lines, m)]
    else:
        keep = list(range(len(muts)))
    if len(keep) <= cap:
        return keep
    return sorted(random.Random(12345).sample(keep, cap))


def select_old(muts, cap):
    if len(muts) <= cap:
        return list(range(len(muts)))
    # keep all relational/logical/return mutants first, then sample the rest deterministically
    rnd = random.Random(12345)
    pri = [i for i, m in enumerate(muts) if m[1].startswith(('rel', 'log', 'ret'))]
    rest = [i for i in range(len(muts)) if i not in pri]
    if len(pri) > cap:
        pri = sorted(rnd.sample(pri, cap))
        rest = []
    else:
        rest = sorted(rnd.sample(rest, min(len(rest), cap - len(pri))))
    return sorted(pri + rest)


def main():
    if len(sys.argv) < 3 or sys.argv[2] not in MODULES:
        sys.stderr.write(__doc__ + '\nmodules: %s\n' % ' '.join(sorted(MODULES)))
        sys.exit(2)
    action, mod = sys.argv[1], sys.argv[2]
    path, targets, tests, _, cap = MODULES[mod]
    full = os.path.join(ROOT, path)
    if action in ('emit', 'list'):  # from git: the working file may be a mutant right now
        src = subprocess.run(['git', '-C', ROOT, 'show', 'HEAD:' + path], stdout=subprocess.PIPE).stdout.decode()
        full = '/tmp/orig_' + os.path.basename(path)
        open(full, 'w').write(src)
    orig = open(full).read()
    lines, muts = gen_mutants(full)
    rng = MODULES[mod][3]
    if rng:  # only lines in [lo, hi] (e.g. not the ticker thread)
        muts = [m for m in muts if rng[0] <= m[0] <= rng[1]]
    ids = select(muts, cap, lines)
    if action == 'list':
        for i in ids:
            n, op, new = muts[i]
            print('%d\t%d\t%s\t%s\t=>\t%s' % (i, n, op, lines[n - 1].strip(), new.strip()))
        print('# %d generated, %d selected' % (len(muts), len(ids)), file=sys.stderr)
        return
    if action == 'emit':  # the mutated file on stdout (the source untouched)
        n, op, new = muts[int(sys.argv[3])]
        l2 = list(lines); l2[n - 1] = new
        sys.stdout.write('\n'.join(l2))
        return
    if action == 'one':
        i = int(sys.argv[3])
        n, op, new = muts[i]
        l2 = list(lines); l2[n - 1] = new
        open(full, 'w').write('\n'.join(l2))
        print('applied', i, n, op)
        return
    if len(sys.argv) > 3:
        ids = [int(x) for x in sys.argv[3:]]
    os.makedirs(ROOT + '/results', exist_ok=True)
    out = open(ROOT + '/results/%s.tsv' % mod, 'a')
    try:
        for i in ids:
            n, op, new = muts[i]
            l2 = list(lines); l2[n - 1] = new
            open(full, 'w').write('\n'.join(l2))
            t0 = time.time()
            p = subprocess.run(['cmake', '--build', B, '-j1', '--target'] + targets,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if p.returncode != 0:
                res, det = 'build-failed', ''
            else:
                res, det = 'survived', ''
                for t in tests:
                    rc, o = sh(t, 120 if t is SIM else 60)
                    if rc == 'timeout':
                        res, det = 'timeout', os.path.basename(t[0])
                        break
                    if rc != 0:
                        res, det = 'killed', os.path.basename(t[0] if t is not FUZZ else 'fuzz_replay')
                        break
            rec = '%d\t%s:%d\t%s\t%s\t%s\t%.1fs\t%s\t=>\t%s' % (i, path, n, op, res, det, time.time() - t0,
                                                        lines[n - 1].strip(), new.strip())
            print(rec, flush=True)
            out.write(rec + '\n'); out.flush()
    finally:
        open(full, 'w').write(orig)
        subprocess.run(['cmake', '--build', B, '-j1', '--target'] + targets,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


if __name__ == '__main__':
    main()
