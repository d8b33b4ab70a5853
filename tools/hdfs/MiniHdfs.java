// A live HDFS for rlm's tests (rlm/testing/hdfs_cluster.py): Hadoop's MiniDFSCluster on loopback,
// run as a single-file source program on the jars `make hdfs` fetched (no build step):
//
//   java -cp '.cache/hadoop-3.4.2/libs/*' tools/hdfs/MiniHdfs.java BASEDIR NN_PORT HTTP_PORT DATANODES
//
// Prints "ready <rpc port> <http port>" once the NameNode is active and every DataNode reported,
// then reads one command per line on stdin and answers "ok <command>" (or "error <message>"):
//   stop-datanode I      stop DataNode I (its blocks stay on disk)
//   start-datanode I     start it again on the same ports and storage
//   restart-namenode     stop the NameNode and start it again on the same ports and metadata
//   stop                 shut everything down and exit 0 (EOF on stdin does the same)
// The data lives under BASEDIR, formatted on the first start only (a later start on the same
// BASEDIR keeps it). Not rlm code: a launcher for a Hadoop test utility.
import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.util.HashMap;
import java.util.Map;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;

public class MiniHdfs {
    public static void main(String[] args) throws Exception {
        File base = new File(args[0]);
        boolean fresh = !new File(base, "data").exists();
        Configuration conf = new Configuration();
        conf.setBoolean("dfs.webhdfs.enabled", true);
        conf.set("dfs.namenode.rpc-address", "127.0.0.1:" + args[1]);
        conf.set("dfs.namenode.http-address", "127.0.0.1:" + args[2]);
        conf.set("hadoop.proxyuser." + System.getProperty("user.name") + ".hosts", "*");
        conf.set("hadoop.proxyuser." + System.getProperty("user.name") + ".groups", "*");
        conf.setBoolean("dfs.permissions.enabled", false);
        MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf, base)
            .nameNodePort(Integer.parseInt(args[1]))
            .nameNodeHttpPort(Integer.parseInt(args[2]))
            .numDataNodes(Integer.parseInt(args[3]))
            .format(fresh)
            .manageNameDfsDirs(true)
            .manageDataDfsDirs(true)
            .checkDataNodeHostConfig(true)
            .build();
        cluster.waitActive();
        System.out.println("ready " + cluster.getNameNodePort() + " " + cluster.getNameNode().getHttpAddress().getPort());
        System.out.flush();
        Map<Integer, MiniDFSCluster.DataNodeProperties> stopped = new HashMap<>();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            String[] cmd = line.trim().split(" ");
            try {
                if (cmd[0].equals("stop")) {
                    break;
                } else if (cmd[0].equals("stop-datanode")) {
                    int i = Integer.parseInt(cmd[1]);
                    stopped.put(i, cluster.stopDataNode(i));
                } else if (cmd[0].equals("start-datanode")) {
                    int i = Integer.parseInt(cmd[1]);
                    // stopDataNode removed it from the list: it comes back at the end of it
                    cluster.restartDataNode(stopped.remove(i), true);
                    cluster.waitActive();
                } else if (cmd[0].equals("restart-namenode")) {
                    cluster.restartNameNode(true);
                } else {
                    throw new IllegalArgumentException("unknown command " + cmd[0]);
                }
                System.out.println("ok " + line.trim());
            } catch (Exception e) {
                System.out.println("error " + e.toString().replace('\n', ' '));
            }
            System.out.flush();
        }
        cluster.shutdown();
        System.exit(0);
    }
}
