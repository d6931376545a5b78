// pglite-server.mjs: PGlite (Postgres compiled to WASM) with the pgvector
// extension behind the Postgres wire protocol on 127.0.0.1, for tests.
//
//   node pglite-server.mjs --node-dir DIR [--port N]
//
// DIR is the npm prefix holding node_modules/@electric-sql/{pglite,
// pglite-pgvector,pglite-socket} (the repository's .cache/node). Port 0 (the
// default) lets the kernel pick a free one. The database lives in memory and
// is gone when the process ends. Once the vector extension is created and
// the socket listens, one line goes to stdout:
//
//   pglite ready 127.0.0.1:PORT
//
// The server serves one connection at a time (PGlite is single-user
// Postgres): a second one waits until the first has closed, and starts
// with a fresh session (DISCARD ALL).
// It stops on SIGTERM or SIGINT, and when its stdin closes (so it does not
// outlive the test that started it).
import { readFileSync } from 'node:fs'
import { connect, createServer } from 'node:net'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'

function fail(msg) {
  process.stderr.write(`pglite-server: ${msg}\n`)
  process.exit(1)
}

function parseArgs(argv) {
  const opts = { port: 0, nodeDir: '' }
  for (let i = 0; i < argv.length; i++) {
    const [flag, inline] = argv[i].split(/=(.*)/s, 2)
    const value = () => {
      if (inline !== undefined) return inline
      if (i + 1 >= argv.length) fail(`${flag} needs a value`)
      return argv[++i]
    }
    switch (flag) {
      case '--port': {
        const v = value()
        const n = Number(v)
        if (!Number.isInteger(n) || n < 0 || n > 65535) fail(`--port ${v}: want an integer from 0 to 65535`)
        opts.port = n
        break
      }
      case '--node-dir':
        opts.nodeDir = value()
        break
      default:
        fail(`unknown argument ${argv[i]} (want --node-dir DIR [--port N])`)
    }
  }
  if (opts.nodeDir === '') fail('--node-dir DIR is required (the npm prefix the PGlite packages are installed in)')
  return opts
}

// load imports a package's ES module entry point from DIR/node_modules (an
// ES module resolves bare names from its own location, not from DIR).
async function load(nodeDir, name) {
  const dir = join(nodeDir, 'node_modules', name)
  let pkg
  try {
    pkg = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8'))
  } catch (err) {
    fail(`${name} is not installed in ${nodeDir} (${err.code ?? err.message}): npm install --prefix ${nodeDir} @electric-sql/pglite@0.5.14 @electric-sql/pglite-pgvector@0.0.15 @electric-sql/pglite-socket@0.2.17`)
  }
  const entry = pkg.exports?.['.']?.import?.default ?? pkg.module
  if (typeof entry !== 'string') fail(`${name} ${pkg.version}: no ES module entry point in its package.json`)
  return { version: pkg.version, mod: await import(pathToFileURL(join(dir, entry)).href) }
}

const opts = parseArgs(process.argv.slice(2))
const pglite = await load(opts.nodeDir, '@electric-sql/pglite')
const pgvector = await load(opts.nodeDir, '@electric-sql/pglite-pgvector')
const socket = await load(opts.nodeDir, '@electric-sql/pglite-socket')

// The PGlite socket server listens on a port of its own and refuses a
// second connection ("Too many connections") until it has noticed that
// the first one closed, which it does a moment after the client has gone.
// So clients connect to a front that hands the back one connection at a
// time: the others wait, in order, until the back has let the last one
// go (each bounded by the client's own connect timeout).
let db, back, front
const waiting = []
let active = null
try {
  db = await pglite.mod.PGlite.create({ extensions: { vector: pgvector.mod.vector } })
  await db.exec('CREATE EXTENSION IF NOT EXISTS vector')
  back = new socket.mod.PGLiteSocketServer({ db, host: '127.0.0.1', port: 0, maxConnections: 1 })
  await back.start()
  const backPort = Number(back.getServerConn().split(':').pop())
  front = createServer((client) => {
    client.pause()
    client.on('error', () => {})
    waiting.push(client)
    pump(backPort)
  })
  await new Promise((resolve, reject) => {
    front.once('error', reject)
    front.listen(opts.port, '127.0.0.1', resolve)
  })
} catch (err) {
  fail(`start: ${err?.stack ?? err}`)
}

// pump connects the next waiting client to the back once the back holds
// no connection (checked every 2 ms, for at most 5 s).
async function pump(backPort) {
  if (active !== null) return
  const client = waiting.shift()
  if (client === undefined) return
  active = client
  for (let i = 0; back.getStats().activeConnections > 0; i++) {
    if (i >= 2500) {
      process.stderr.write('pglite-server: the back still holds a connection after 5s; dropping a client\n')
      break
    }
    await new Promise((r) => setTimeout(r, 2))
  }
  if (client.destroyed) {
    active = null
    return pump(backPort)
  }
  // Every connection shares PGlite's one session: give each a fresh one,
  // as Postgres would (else a client's prepared statements, settings and
  // temporary tables are the next one's, and pgx's statement cache fails
  // with "prepared statement ... already exists").
  try {
    if (db.isInTransaction()) await db.exec('ROLLBACK')
    await db.exec('DISCARD ALL')
  } catch (err) {
    process.stderr.write(`pglite-server: resetting the session: ${err?.message ?? err}\n`)
  }
  const up = connect(backPort, '127.0.0.1')
  up.on('error', () => {})
  let open = 2
  const closed = () => {
    client.destroy()
    up.destroy()
    if (--open === 0) {
      active = null
      pump(backPort)
    }
  }
  client.once('close', closed)
  up.once('close', closed)
  client.pipe(up)
  up.pipe(client)
  client.resume()
}

let stopping = false
async function stop(why) {
  if (stopping) return
  stopping = true
  process.stderr.write(`pglite-server: stopping (${why})\n`)
  for (const c of waiting) c.destroy()
  active?.destroy()
  front.close()
  // In memory: nothing to keep, so a slow close does not hold the exit.
  const closing = (async () => {
    await back.stop()
    await db.close()
  })()
  await Promise.race([closing, new Promise((r) => setTimeout(r, 3000))]).catch((err) => {
    process.stderr.write(`pglite-server: stop: ${err?.message ?? err}\n`)
  })
  process.exit(0)
}
process.on('SIGTERM', () => stop('SIGTERM'))
process.on('SIGINT', () => stop('SIGINT'))
process.stdin.on('end', () => stop('stdin closed'))
process.stdin.on('error', () => stop('stdin error'))
process.stdin.resume()

process.stderr.write(`pglite-server: pglite ${pglite.version}, pglite-pgvector ${pgvector.version}, pglite-socket ${socket.version}\n`)
process.stdout.write(`pglite ready 127.0.0.1:${front.address().port}\n`)
