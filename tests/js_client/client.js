#!/usr/bin/env node
// A GoSched API client in another language: Node.js with @grpc/grpc-js, the service and message
// types loaded at run time from proto/v1/*.proto by @grpc/proto-loader (no Python involved).
//
//   node tests/js_client/client.js 127.0.0.1:9090
//
// It submits a job ("from-js": one group "worker", 2 replicas), submits it again under the same
// submission_id (idempotent: created false), reads it back with GetJob until it is RUNNING (at
// most GOSCHED_JS_WAIT_S seconds, default 10), lists jobs, and submits two bad specs
// (replicas 0, negative cpu), recording the status code and message of each. It prints one JSON
// object on stdout. Any unexpected failure: the gRPC status code and details on stderr, exit 1.
// Run by tests/test_api_other_language.py; install the packages with deploy/dev-env.sh.
'use strict';

const fs = require('fs');
const os = require('os');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

// proto/ of this checkout; the .proto files import each other as "gosched/proto/v1/x.proto".
const PROTO_DIR = process.env.GOSCHED_PROTO_DIR || path.resolve(__dirname, '..', '..', 'proto');
const CALL_TIMEOUT_MS = 10000;
const WAIT_S = Number(process.env.GOSCHED_JS_WAIT_S || '10');

const STATUS_NAMES = Object.fromEntries(
  Object.entries(grpc.status).map(([name, code]) => [code, name]),
);

// Load through an include root in which gosched/proto/v1/x.proto resolves (as proto/generate.py
// does for protoc): <tmp>/gosched/proto -> PROTO_DIR. Removed again once loaded.
function loadJobService() {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'gosched-js-proto-'));
  const link = path.join(root, 'gosched', 'proto');
  try {
    fs.mkdirSync(path.join(root, 'gosched'));
    fs.symlinkSync(PROTO_DIR, link, 'dir');
    const definition = protoLoader.loadSync(['gosched/proto/v1/jobs.proto'], {
      includeDirs: [root],
      keepCase: true, // field names as in the .proto (submission_id, task_counts)
      longs: String,
      enums: String, // enum values by name: "JOB_STATE_RUNNING"
      defaults: true,
      arrays: true,
      objects: true,
      oneofs: true,
    });
    return grpc.loadPackageDefinition(definition).gosched.v1.JobService;
  } finally {
    fs.rmSync(link, { force: true }); // the link only, never what it points to
    fs.rmSync(root, { recursive: true, force: true });
  }
}

function call(client, method, request) {
  const deadline = new Date(Date.now() + CALL_TIMEOUT_MS);
  return new Promise((resolve, reject) => {
    client[method](request, { deadline }, (err, reply) => (err ? reject(err) : resolve(reply)));
  });
}

function describe(err) {
  return { code: err.code, code_name: STATUS_NAMES[err.code] || 'UNKNOWN', details: err.details || err.message };
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function goodSpec() {
  return {
    id: 'from-js',
    queue: 'default',
    min_member: 2, // proto3 optional: set, so the server sees it present
    labels: { origin: 'node' },
    submission_id: 'js-client-1',
    groups: [
      {
        role: 'worker',
        replicas: 2,
        command: ['echo', 'hi'],
        env: { GREETING: 'hi' },
        resources: { cpu: '1', memory: '1Gi' },
      },
    ],
  };
}

function badSpecs() {
  const group = { role: 'worker', command: ['echo', 'hi'], resources: { cpu: '1', memory: '1Gi' } };
  return {
    // replicas is `optional int32`: an explicit 0 must reach the server as present (not as unset,
    // which would mean the default 1) and be refused.
    replicas_zero: { id: 'from-js-bad-replicas', groups: [{ ...group, replicas: 0 }] },
    negative_cpu: {
      id: 'from-js-bad-cpu',
      groups: [{ ...group, replicas: 1, resources: { cpu: '-1', memory: '1Gi' } }],
    },
  };
}

async function main() {
  const target = process.argv[2];
  if (!target) {
    throw Object.assign(new Error('usage: node client.js HOST:PORT'), { usage: true });
  }
  const JobService = loadJobService();
  const client = new JobService(target, grpc.credentials.createInsecure());
  try {
    const submitted = await call(client, 'SubmitJob', { spec: goodSpec() });
    const again = await call(client, 'SubmitJob', { spec: goodSpec() });

    const states = [];
    let job = await call(client, 'GetJob', { job_id: submitted.job_id });
    states.push(job.state);
    const until = Date.now() + WAIT_S * 1000;
    while (job.state !== 'JOB_STATE_RUNNING' && Date.now() < until) {
      await sleep(100);
      job = await call(client, 'GetJob', { job_id: submitted.job_id });
      if (job.state !== states[states.length - 1]) states.push(job.state);
    }

    const listed = await call(client, 'ListJobs', { page_size: 1000 });

    const rejected = {};
    for (const [name, spec] of Object.entries(badSpecs())) {
      try {
        const reply = await call(client, 'SubmitJob', { spec });
        rejected[name] = { code: 0, code_name: 'OK', details: '', job_id: reply.job_id };
      } catch (err) {
        if (err.code === undefined) throw err;
        rejected[name] = describe(err);
      }
    }

    const group = job.spec.groups[0] || {};
    const result = {
      language: 'javascript',
      node_version: process.version,
      grpc_js_version: require('@grpc/grpc-js/package.json').version,
      submit: {
        job_id: submitted.job_id,
        created: submitted.created,
        state: submitted.job ? submitted.job.state : null,
      },
      resubmit: { job_id: again.job_id, created: again.created },
      get: {
        job_id: job.id,
        state: job.state,
        states_seen: states,
        task_count: job.tasks.length,
        tasks: job.tasks.map((t) => ({ id: t.id, index: t.index, role: t.role, state: t.state, node: t.node })),
        task_counts: job.task_counts,
        spec: {
          id: job.spec.id,
          queue: job.spec.queue,
          min_member: job.spec.min_member,
          labels: job.spec.labels,
          submission_id: job.spec.submission_id,
          group: {
            role: group.role,
            replicas: group.replicas,
            command: group.command,
            env: group.env,
            resources: group.resources && { cpu: group.resources.cpu, memory: group.resources.memory },
          },
        },
      },
      list: {
        job_ids: listed.jobs.map((j) => j.id),
        states: Object.fromEntries(listed.jobs.map((j) => [j.id, j.state])),
        next_page_token: listed.next_page_token,
      },
      rejected,
    };
    process.stdout.write(JSON.stringify(result) + '\n');
  } finally {
    client.close();
  }
}

main().catch((err) => {
  if (err.usage) {
    process.stderr.write(err.message + '\n');
    process.exit(2);
  }
  if (err.code !== undefined && STATUS_NAMES[err.code] !== undefined) {
    process.stderr.write(`gRPC error: code ${err.code} (${STATUS_NAMES[err.code]}): ${err.details}\n`);
  } else {
    process.stderr.write(`error: ${err.stack || err}\n`);
  }
  process.exit(1);
});
