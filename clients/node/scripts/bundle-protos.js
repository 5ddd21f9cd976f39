#!/usr/bin/env node
'use strict';
/**
 * The package's own copy of the gateway's contract: copies proto/mqstore/v1 of the repository into
 * ./proto/mqstore/v1, so the packed client loads its .proto files from inside the package and runs
 * outside the repository. npm runs it before `npm pack` / `npm publish` (prepack); `--clean` removes the
 * copy again afterwards (postpack), so a checkout keeps loading the repository's proto/ directly.
 *
 * The copy is built under a temporary name and renamed into place: a client loading the protos while
 * the package is packed sees either no copy or a whole one.
 */
const fs = require('node:fs');
const path = require('node:path');

const PACKAGE_DIR = path.resolve(__dirname, '..');
const SOURCE = path.resolve(PACKAGE_DIR, '..', '..', 'proto', 'mqstore', 'v1');
const TARGET_ROOT = path.join(PACKAGE_DIR, 'proto');

function clean() {
  fs.rmSync(TARGET_ROOT, { recursive: true, force: true });
}

function bundle() {
  if (!fs.existsSync(path.join(SOURCE, 'gateway.proto'))) {
    throw new Error(`no ${path.join(SOURCE, 'gateway.proto')}: pack the client from a checkout of the repository`);
  }
  const staging = `${TARGET_ROOT}.tmp-${process.pid}`;
  fs.rmSync(staging, { recursive: true, force: true });
  const target = path.join(staging, 'mqstore', 'v1');
  fs.mkdirSync(target, { recursive: true });
  const names = fs.readdirSync(SOURCE).filter((name) => name.endsWith('.proto')).sort();
  for (const name of names) {
    fs.copyFileSync(path.join(SOURCE, name), path.join(target, name));
  }
  clean();
  fs.renameSync(staging, TARGET_ROOT);
  process.stdout.write(`bundled ${names.length} .proto files of mqstore.v1 into ${path.relative(process.cwd(), TARGET_ROOT) || '.'}\n`);
}

if (process.argv.includes('--clean')) {
  clean();
} else {
  bundle();
}
