"""ParameterServerStrategy: the chief coordinates, workers and ps serve, all from TF_CONFIG.

Workers and ps only start a tf.distribute.Server and wait; the chief schedules
training steps on them and writes $GPUPOOL_JOB_DIR/results/chief-0.json.
gpupool stops the servers once the chief is done (success policy "chief").
"""

import json
import os
from pathlib import Path

import tensorflow as tf

STEPS = int(os.environ.get("STEPS", "20"))
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()

if resolver.task_type in ("worker", "ps"):
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    server.join()

strategy = tf.distribute.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    w = tf.Variable(tf.zeros([4, 1]))
    b = tf.Variable(tf.zeros([1]))
true_w = tf.constant([[1.0], [-2.0], [3.0], [0.5]])


def dataset_fn():
    x = tf.random.stateless_normal([512, 4], seed=[1, 2])
    return tf.data.Dataset.from_tensor_slices((x, tf.matmul(x, true_w))).repeat().batch(32)


iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))


@tf.function
def step(it):
    def replica_fn(batch):
        x, y = batch
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
        gw, gb = tape.gradient(loss, [w, b])
        w.assign_sub(0.1 * gw)
        b.assign_sub(0.1 * gb)
        return loss

    return strategy.run(replica_fn, args=(next(it),))


losses = [coordinator.schedule(step, args=(iterator,)) for _ in range(STEPS)]
coordinator.join()
result = {
    "task": {"type": "chief", "index": 0},
    "steps": len(losses),
    "loss": float(losses[-1].fetch()),
    "workers": len(resolver.cluster_spec().as_dict().get("worker", [])),
}
out = Path(os.environ.get("GPUPOOL_JOB_DIR", ".")) / "results"
out.mkdir(parents=True, exist_ok=True)
(out / "chief-0.json").write_text(json.dumps(result))
print(json.dumps(result), flush=True)
