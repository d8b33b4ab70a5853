// Spark SQL with Apache Iceberg's Spark runtime, for rlm's tests (rlm/testing/iceberg_spark.py): a
// local Spark driver, run as a single-file source program on the jars `make iceberg-spark` fetched
// (Spark itself, iceberg-spark-runtime, sqlite-jdbc; no build step):
//
//   java -Dspark.sql.catalog.rlm=... -cp '.cache/iceberg-spark-<v>/libs/*' tools/iceberg-spark/IcebergSparkSql.java
//
// Every `spark.*` Java system property is Spark configuration (SparkConf reads them). Prints
// "ready <spark version>" once the session is up, then reads one command per line on stdin and
// answers one line, "ok ..." or "error <message>":
//   session                  a new session (its own SQL conf and catalogs; the first is the default)
//   set KEY=VALUE            a runtime SQL conf of the current session (e.g. a catalog's uri)
//   sql STATEMENT            run it; "ok <its rows as a JSON array>" (small results: CALL, DESCRIBE)
//   parquet DIR STATEMENT    run it and write its rows to the Parquet directory DIR; "ok <rows>"
//   stop                     stop Spark and exit 0 (EOF on stdin does the same)
// Not rlm code: a stand-in for `spark-sql --packages ...` that a test can drive line by line.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.List;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;

public class IcebergSparkSql {
    public static void main(String[] args) throws Exception {
        SparkSession root = SparkSession.builder().appName("rlm-iceberg-spark").getOrCreate();
        SparkSession spark = root;
        System.out.println("ready " + root.version());
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            String[] cmd = line.split(" ", 2);
            String rest = cmd.length > 1 ? cmd[1] : "";
            try {
                String answer = "";
                if (cmd[0].equals("stop")) {
                    break;
                } else if (cmd[0].equals("session")) {
                    spark = root.newSession();
                } else if (cmd[0].equals("set")) {
                    String[] kv = rest.split("=", 2);
                    spark.conf().set(kv[0], kv[1]);
                } else if (cmd[0].equals("sql")) {
                    List<String> rows = spark.sql(rest).toJSON().collectAsList();
                    answer = "[" + String.join(",", rows) + "]";
                } else if (cmd[0].equals("parquet")) {
                    String[] dirSql = rest.split(" ", 2);
                    Dataset<Row> rows = spark.sql(dirSql[1]).cache();
                    rows.write().parquet(dirSql[0]);
                    answer = Long.toString(rows.count());
                    rows.unpersist();
                } else {
                    throw new IllegalArgumentException("unknown command " + cmd[0]);
                }
                System.out.println("ok " + answer);
            } catch (Exception e) {
                Throwable cause = e;
                while (cause.getCause() != null) cause = cause.getCause();
                String message = e.toString().split("\n", 2)[0] + (cause == e ? "" : " (caused by " + cause + ")");
                System.out.println("error " + message.replace('\n', ' '));
            }
            System.out.flush();
        }
        root.stop();
        System.exit(0);
    }
}
