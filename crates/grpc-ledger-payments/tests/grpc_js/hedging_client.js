// A grpc-js client that hedges keyed payments, as a Node service would call the payments API:
// each payment is one call under its own idempotency key, sent as up to three copies at once
// (hedgingDelay 0s), UNAVAILABLE (a lost answer) non-fatal. It reports how each call ended on its
// first pass, then resends the ones that failed under the same key until they succeed, and prints
// one JSON line: what the Rust test reconciles against the store.
//
// node hedging_client.js ADDR PROTO_DIR OPTIONS_DIR RUN COUNT CONCURRENCY
'use strict';

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const [addr, protoDir, optionsDir, run, countText, concurrencyText] = process.argv.slice(2);
const count = Number(countText);
const concurrency = Number(concurrencyText);

const definition = protoLoader.loadSync('payments.proto', {
  includeDirs: [protoDir, optionsDir],
  keepCase: true,
});
const { Payments } = grpc.loadPackageDefinition(definition).payments.v1;

const serviceConfig = {
  methodConfig: [{
    name: [{ service: 'payments.v1.Payments', method: 'CreatePayment' }],
    hedgingPolicy: {
      maxAttempts: 3,
      hedgingDelay: '0s',
      nonFatalStatusCodes: ['UNAVAILABLE'],
    },
  }],
};
const client = new Payments(addr, grpc.credentials.createInsecure(), {
  'grpc.service_config': JSON.stringify(serviceConfig),
  'grpc.enable_retries': 1,
});

function pay(index) {
  const metadata = new grpc.Metadata();
  metadata.set('authorization', 'Bearer demo-client-token');
  metadata.set('idempotency-key', `js-${run}-${index}`);
  const request = { account: `js-${run}-${index}`, amount_minor: 100 + index };
  return new Promise((resolve) => {
    client.CreatePayment(request, metadata, { deadline: Date.now() + 10000 }, (error, payment) => {
      resolve(error ? { code: grpc.status[error.code] } : { paymentId: payment.payment_id });
    });
  });
}

async function main() {
  const firstPass = {};
  const paymentIds = {};
  const failedFirst = [];
  let next = 0;
  async function worker() {
    while (next < count) {
      const index = next++;
      const answer = await pay(index);
      const outcome = answer.code || 'OK';
      firstPass[outcome] = (firstPass[outcome] || 0) + 1;
      if (answer.paymentId) {
        paymentIds[index] = answer.paymentId;
      } else {
        failedFirst.push(index);
      }
    }
  }
  await Promise.all(Array.from({ length: concurrency }, worker));
  // The failed first passes, resent under their keys until they succeed (a few tries).
  let resends = 0;
  for (const index of failedFirst) {
    for (let attempt = 0; attempt < 10 && !paymentIds[index]; attempt++) {
      resends++;
      const answer = await pay(index);
      if (answer.paymentId) {
        paymentIds[index] = answer.paymentId;
      }
    }
  }
  console.log(JSON.stringify({ sent: count, firstPass, resends, paymentIds }));
  client.close();
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
